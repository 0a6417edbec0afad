// crew/detail/pool_core.hpp: detail::PoolCore, the part of a pool that the
// inline submission path (detail::Submission, submission.hpp) needs: the
// options, the pool's lifecycle, the idle counts, the id and refusal
// counters, the shared queue's rings, and after_push. The inline push
// reaches only the calling worker's own queue (local_queue.hpp) and the
// ring of its home shard (ring.hpp); the rest of the queues (Queues, held
// in place without its header: other shards, spill queues, newest-first
// stacks) and every slower step (a full queue, a wake-up, a sweep after
// close, an event, the overload controller, the workers, the supervisor,
// shutdown) are out-of-line calls into the engine (src/engine/submission.cpp
// and src/engine/pool_runtime.hpp: PoolRuntime and its units, reached
// through a std::unique_ptr). docs/design/architecture.md maps the units.
//
// Who touches what on the hot path:
//   submitter: a ring's tail and slot, or its own local queue's bottom;
//              reads life_ (the pool's state) and idle_ (its counts)
//   worker:    queue_ head and slot; its own Worker counters
// All of PoolCore's state is private; Submission and the engine's units are
// its friends.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/cell.hpp"
#include "crew/detail/deadline.hpp"
#include "crew/detail/idle_counts.hpp"
#include "crew/detail/local_queue.hpp"
#include "crew/detail/pool_lifecycle.hpp"
#include "crew/detail/ring.hpp"
#include "crew/detail/runner.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/error.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"

namespace crew {
enum class LogLevel : std::uint8_t;  // crew/log.hpp
struct LogContext;                   // crew/log.hpp
}  // namespace crew

namespace crew::detail {

class PoolCore;
// The engine's part that PoolCore holds but the inline submission path
// never touches: the queues as a whole (crew/detail/queues.hpp, reached
// through Submission's out-of-line push once the home ring is full). The
// overload controller's header is included (through runner.hpp): an
// admitted task takes and returns its ticket inline.
class Queues;

// A member of type T, complete only where it is used: storage of T's size
// and alignment in the object, so that reaching it costs no pointer (as a
// std::unique_ptr would), while the header declaring the object need not
// include T's. Constructed, used and destroyed only where T is complete
// (the engine); Size and Align are checked there.
template <class T, std::size_t Size, std::size_t Align>
class InPlace {
 public:
  template <class... Args>
  explicit InPlace(Args&&... args) {
    static_assert(sizeof(T) <= Size && alignof(T) <= Align, "InPlace: raise Size or Align");
    ::new (static_cast<void*>(mem_)) T(std::forward<Args>(args)...);
  }
  ~InPlace() { get().~T(); }
  InPlace(const InPlace&) = delete;
  InPlace& operator=(const InPlace&) = delete;

  T& get() noexcept { return *std::launder(reinterpret_cast<T*>(mem_)); }
  const T& get() const noexcept { return *std::launder(reinterpret_cast<const T*>(mem_)); }
  T* operator->() noexcept { return &get(); }
  const T* operator->() const noexcept { return &get(); }

 private:
  alignas(Align) unsigned char mem_[Size];
};

struct PoolRuntime;
class SuspendedTasks;  // crew/detail/suspended_tasks.hpp (coroutine tasks)

// Whether `m` is one of the three modes (a value cast from an integer may
// not be).
constexpr bool valid_shutdown_mode(ShutdownMode m) noexcept {
  return m == ShutdownMode::drain || m == ShutdownMode::soft || m == ShutdownMode::hard;
}

struct Worker;
class Supervisor;

// Whether the calling thread may nest a task that is not its own (taken
// from the shared queue or another worker) in a wait: while at most a
// sixteenth of its stack is in use.
bool stack_allows_help() noexcept;
// Whether the calling thread's stack has its reserve left below the current
// frame (a sixteenth of the stack, at least 32 KiB and at most a quarter;
// where waits cannot throw, half the reserve): a wait nests a queued task
// only then, and otherwise cancels the task it waits for and throws
// Error(stack_exhausted) (see waits_may_throw_for_stack), or, where it
// cannot throw, returns with the task settled as cancelled. On a stack that
// is not the thread's own (a fiber's, a stackful coroutine's) or one of
// unknown size: only while no task runs nested on it yet; past that such a
// wait sleeps instead.
bool stack_allows_nesting() noexcept;
// Whether the calling frame is on a stack other than the thread's own, or
// on a thread whose stack is unknown.
bool on_foreign_stack() noexcept;
// The text of that Error, naming `what` was not run.
std::string stack_exhausted_message(std::string_view what);
// False while the calling thread waits where it cannot throw (~Group, or
// while an exception unwinds): there a wait stops nesting the task it waits
// for at half the reserve (it cancels it without throwing), and runs the
// caller's own queued tasks down to a quarter of it.
bool waits_may_throw_for_stack() noexcept;
// Marks the calling thread's scope as one whose waits cannot throw.
struct NoStackThrowScope {
  NoStackThrowScope() noexcept;
  ~NoStackThrowScope();
  NoStackThrowScope(const NoStackThrowScope&) = delete;
  NoStackThrowScope& operator=(const NoStackThrowScope&) = delete;
};

// The worker running on this thread, if any (set for the life of its loop).
struct CurrentWorker {
  PoolCore* core = nullptr;
  Worker* worker = nullptr;
  // The worker's own local queue, or null (it has none).
  LocalQueue* local_queue = nullptr;
  // Task ids reserved by this worker: [next_id, end_id). Forked tasks take
  // their ids here instead of from the pool's shared counter.
  std::uint64_t next_id = 0;
  std::uint64_t end_id = 0;
};
inline thread_local CurrentWorker t_current{};

// Marks a task of `core` running on a thread that may not be one of its
// workers (caller_runs, run_pending_task, a wait running a queued task), for
// the length of the run; nested runs chain through `outer`.
struct InlineRun;
inline thread_local const InlineRun* t_inline_run = nullptr;
struct InlineRun {
  explicit InlineRun(const PoolCore* c) noexcept : core(c), outer(t_inline_run) {
    t_inline_run = this;
  }
  ~InlineRun() { t_inline_run = outer; }
  InlineRun(const InlineRun&) = delete;
  InlineRun& operator=(const InlineRun&) = delete;
  const PoolCore* core;
  const InlineRun* outer;
};

// Outcomes decided off the workers: refusals, caller-thread runs, shutdown
// drops, abandonments. Rare paths, so shared atomics are fine.
struct SharedCounters {
  std::atomic<std::uint64_t> succeeded{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> cancelled{0};
  std::atomic<std::uint64_t> timed_out{0};
  std::atomic<std::uint64_t> rejected{0};
  std::atomic<std::uint64_t> shed{0};

  void add(TaskStatus outcome) noexcept;
  [[nodiscard]] OutcomeCounts read() const noexcept;
};

// The Runner of the threads that run a pool's tasks outside a worker's top
// level: a caller_runs submission, a wait that runs queued tasks
// (run_pending, help_until), a shutdown's sweep. Each run is marked an
// InlineRun for its length, and its outcome is counted where the calling
// thread counts (PoolCore::count_outcome). One per pool, a part of
// PoolCore (PoolCore::inline_runner()); defined in src/engine/run.cpp and
// src/engine/help.cpp.
//
// Who touches what: any thread that runs one of the pool's tasks outside
// a worker's loop; its own state is the count of tasks that waits on
// threads other than the pool's workers took from the queue (a worker
// counts its own).
class InlineRunner final : public Runner {
 public:
  explicit InlineRunner(PoolCore& core) noexcept : c_(core) {}
  InlineRunner(const InlineRunner&) = delete;
  InlineRunner& operator=(const InlineRunner&) = delete;
  ~InlineRunner() = default;

  // Runs (or, while dropping, rejects) one queued cell on this thread. On a
  // worker of this pool: its own local queue first, newest first; then, if
  // the stack has room (stack_allows_help), the shared queue and the other
  // workers' queues. That order bounds the nesting of waits by the depth of
  // the program's recursion. False if there was nothing (or the pool is
  // paused).
  bool run_pending();
  // Waits for `s` (a task of this pool) until `deadline` on a worker of this
  // pool, running queued tasks meanwhile (run_pending's order, and `s`
  // itself if it is still queued). Returns whether `s` ended.
  bool help_until(TaskStateBase* s, std::chrono::steady_clock::time_point deadline);
  // One step of run_pending: from the caller's own local queue (`own`), from
  // anywhere else (`foreign`, only while the stack has room).
  bool help_once(bool own, bool foreign);
  // Runs a task state on the calling thread (nested waits, caller_runs).
  // The caller has already moved it from queued to running. `drop_ref`:
  // the caller's reference (the queue cell's) is dropped here, and the
  // caller must not touch `s` afterwards (see PoolCore::run_claimed).
  void run_claimed_here(TaskStateBase* s, bool drop_ref) noexcept;
  // Runs a popped plain cell on this thread (shutdown sweeps); long and
  // observed cells go through this Runner.
  void run_cell_here(Cell& cell) noexcept;

  // Runner. run_long wraps the call in a task state (one allocation) and
  // runs it with run_claimed_here.
  void run_long(std::chrono::nanoseconds timeout, std::int64_t enqueued_ns, LongCall call,
                void* fn) noexcept override;
  void run_observed(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept override;
  void run_counted(CountedCall call, void* fn) noexcept override { call(fn, *this); }
  void run_admitted(std::int64_t enqueued_ns, PlainCall call, void* fn) noexcept override;
  void count_outcome(TaskStatus outcome) noexcept override;

  // Tasks that run_pending and help_until took on threads that are not the
  // pool's workers (PoolStats::helped adds the workers' own).
  [[nodiscard]] std::uint64_t helped() const noexcept {
    return helped_.load(std::memory_order_relaxed);
  }

 private:
  PoolCore& c_;
  std::atomic<std::uint64_t> helped_{0};
};

class PoolCore final : public std::enable_shared_from_this<PoolCore> {
 public:
  // Validates the options (throws Error(invalid_options) naming the field).
  explicit PoolCore(PoolOptions options);
  ~PoolCore();
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;

  // The control calls (shutdown, pause, resize, wait_idle, ...) and the
  // stats are PoolControl's and PoolSnapshot's (crew/detail/pool_control.hpp).
  [[nodiscard]] PoolState state() const noexcept { return life_.state(); }
  [[nodiscard]] const PoolOptions& options() const noexcept { return opts_; }
  // True on a thread inside one of this pool's tasks (on a worker, or run
  // inline elsewhere): a wait for the pool's tasks would wait for itself.
  [[nodiscard]] bool in_own_task() const noexcept;
  // True in a child of fork() for a pool created before the fork: its
  // workers and supervisor are threads of the parent, so nothing would run
  // its tasks or end its shutdown there.
  [[nodiscard]] bool inherited_by_fork() const noexcept;

  // Reports an exception nobody else will see (handler, else the logger).
  void report_exception(const TaskRef& task, std::exception_ptr e) const noexcept;
  // Logs through opts_.logger if `level` passes its threshold.
  void log(LogLevel level, const LogContext& context, std::string_view message) const noexcept;
  [[nodiscard]] bool logs(LogLevel level) const noexcept { return level >= log_level_; }
  void log_hook_failure(std::string_view hook, std::uint64_t worker,
                        std::exception_ptr e) const noexcept;
  // The Runner of this pool's tasks on threads other than a worker's top
  // level.
  [[nodiscard]] InlineRunner& inline_runner() noexcept { return inline_; }
  // Counts an outcome decided on this thread (a worker's own counters, or
  // the shared ones on any other thread). In src/engine/worker.cpp.
  void count_outcome(TaskStatus outcome) noexcept;

  // ---- the overload controller (crew/overload.hpp; what it sheds once a
  // task is queued: src/engine/shedding.hpp) ----
  // Whether a submission from this thread goes through the overload
  // controller: it is on, and the caller is not one of the pool's own
  // tasks (whose submissions are part of admitted work).
  [[nodiscard]] bool admits_here() const noexcept {
    return overload_ != nullptr && t_current.core != this && t_inline_run == nullptr;
  }
  // The overload controller, or null when it is off.
  [[nodiscard]] OverloadControl* overload() const noexcept { return overload_.get(); }
  // The controller whose ticket a popped task state's cell holds, or null.
  [[nodiscard]] OverloadControl* ticket_of(const TaskStateBase* s) const noexcept {
    return s->overload_ticket() ? overload_.get() : nullptr;
  }

  // ---- observers (src/engine/observer_hub.hpp) ----
  [[nodiscard]] bool observes(std::uint32_t events) const noexcept {
    return (observed_ & events) != 0;
  }
  // Whether some observer wants a task's own events (enqueued, started,
  // finished, rejected): a plain task then goes through the observer path.
  [[nodiscard]] bool observes_tasks() const noexcept { return task_observed_; }
  // The events of tasks whose steps are decided outside a worker's run
  // (the submission path, coroutine tasks) go to the observers through
  // crew/detail/task_events.hpp.
  // A task past its queue deadline that was to run on the submitting
  // thread (Route::run_here, also when it waited for room past its
  // deadline): ends it expired, reports it, and drops the
  // reference its cell would have held.
  void expire_unqueued(TaskStateBase* s) noexcept;
  // ~Pool is done with the core (abandoned threads may still co-own it);
  // PoolStatsHandle reads nothing after that.
  void mark_released() noexcept { released_.store(true, std::memory_order_release); }
  [[nodiscard]] bool released() const noexcept { return released_.load(std::memory_order_acquire); }
  // The engine's parts (src/engine/pool_runtime.hpp), for the engine's own files.
  [[nodiscard]] PoolRuntime& runtime() const noexcept { return *rt_; }

  // Removes a task's queue deadline from the timer heap (it left the queue);
  // for a task without one, a flag test and nothing else: the heap's mutex
  // stays off the common path.
  void disarm_queue_deadline(TaskStateBase* s) noexcept {
    if (s->has_queue_deadline()) disarm_timer(s);
  }
  // For settle_in_queue (any thread that decided a queued task's outcome,
  // holding a reference): disarms its queue deadline and counts it.
  void settled_in_queue(TaskStateBase* s, bool count) noexcept;

  // ---- coroutine tasks (crew/coro.hpp; their pushes are Submission's) ----
  // The pool's coroutine tasks, null before the first spawn.
  [[nodiscard]] SuspendedTasks* suspended() const noexcept {
    return suspended_.p.load(std::memory_order_acquire);
  }
  // Installs `s` unless one is installed; returns the one installed (the
  // pool owns it and destroys it first of its parts).
  // In src/engine/pool_core.cpp.
  SuspendedTasks* install_suspended(std::unique_ptr<SuspendedTasks> s) noexcept;

 private:
  // The engine's shared state (src/engine/pool_runtime.hpp), whose members that
  // need its mutex (the worker books: spawning, write-offs, totals) read
  // and update PoolCore's counters too.
  friend struct PoolRuntime;
  friend class InlineRunner;
  friend class PoolControl;
  friend class PoolSnapshot;
  friend class Shedding;
  friend class Supervisor;
  friend class ShutdownSequence;
  friend class Submission;
  friend class WakePolicy;
  friend class WorkerLoop;
  friend class WorkerRegistry;

  // ---- state (the pool's parts; docs/design/architecture.md says which thread touches what) ----
  // How many forks this process descends from when the pool was created
  // (inherited_by_fork), and whether ~Pool is done with the core (it may
  // outlive the Pool: abandoned threads co-own it). Both cold; first, so
  // that the fields below keep the offsets (and cache lines) they had
  // while PoolCore was a Runner itself, with a vtable pointer here.
  const std::uint32_t forks_at_start_;
  std::atomic<bool> released_{false};
  const PoolOptions opts_;
  // Task-state runs counted and published whose handlers and observers have
  // not yet returned (run_claimed); wait_idle() waits for them too.
  std::atomic<std::uint64_t> epilogues_{0};
  // The events some observer wants (the observers are in PoolRuntime's
  // ObserverHub), and whether any wants task timings.
  const LogLevel log_level_;  // opts_.logger->level(), read once
  const std::uint32_t observed_;
  const bool timed_;
  const bool task_observed_;  // observes_tasks()
  // The overload controller (crew/overload.hpp); null when off.
  const std::unique_ptr<OverloadControl> overload_;
  const bool time_handles_;  // opts_.time_tasks
  // The queues (crew/detail/queues.hpp), in place; the sizes are checked
  // where the engine constructs them.
  InPlace<Queues, 4544, 64> queue_;
  // The inline push's view of queue_'s shared rings, made once by the
  // engine: per level and shard, the shard's ring, or null where a spill
  // queue sits behind it (its pushes go through Queues). Read-only after
  // construction.
  std::unique_ptr<Ring*[]> rings_;
  std::size_t shard_mask_ = 0;  // shards per level - 1 (a power of two)
  // The pool's state, the shutdown's drop switch (popped tasks are
  // rejected, not run) and the attention counter workers poll.
  PoolLifecycle life_;
  std::atomic<std::size_t> max_workers_;
  std::atomic<std::size_t> live_workers_{0};  // started, not exited, not abandoned
  // Spinning tokens and sleeper counts (the sleepers themselves are in
  // the engine's WakePolicy). A submitter wakes a sleeper only when nobody
  // holds a token; the woken worker starts out with one, so one burst costs
  // one wake-up per worker.
  IdleCounts idle_;
  alignas(kCacheLine) std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::uint64_t> refused_{0};  // refused at submission
  // Accepted and settled on the submitting thread: run there, or expired
  // while it waited for room (Submission::route_full).
  std::atomic<std::uint64_t> ran_inline_{0};
  // Steps of coroutine tasks taken off the queues (run, or dropped by a
  // shutdown; Submission::step_taken): cells that are not submissions,
  // taken off the pushes in stats(). Counted when taken, with release,
  // before the step's effects (its task's end): read before the pushes,
  // every step counted is among them, and a step still queued counts as
  // pending work. Counted at its push instead, a step pushed by a thread
  // that is no worker (a deadline's stop, a cancel) could run and end its
  // task before its pusher counted it, and stats() after a drain showed
  // one submission more than outcomes.
  std::atomic<std::uint64_t> steps_{0};
  SharedCounters shared_;
  std::unique_ptr<PoolRuntime> rt_;
  InlineRunner inline_{*this};
  // Last, so destroyed first, while the queues it pushes to still exist.
  struct OwnedSuspended {
    std::atomic<SuspendedTasks*> p{nullptr};
    OwnedSuspended() = default;
    OwnedSuspended(const OwnedSuspended&) = delete;
    OwnedSuspended& operator=(const OwnedSuspended&) = delete;
    ~OwnedSuspended();  // deletes it (src/engine/pool_core.cpp)
  } suspended_;

  // A cell left the queue: blocked submitters may be due for release
  // (inline in src/engine/pool_runtime.hpp, for the workers' pops).
  void on_slot_freed() noexcept;

  // `own_queue`: the push went to the calling worker's own queue. That
  // worker runs the task itself unless a thief takes it first, so any
  // spinning token is enough there, running or not (and fork-join pushes,
  // tens of nanoseconds apart, skip the heartbeat's clock read); a task in
  // the shared queue is left only to a spinner that is running.
  void after_push(bool own_queue = false) noexcept {
    // A shared-queue push claimed its slot with a seq_cst read-modify-write,
    // so these loads see any worker that went to sleep before it (it
    // re-checks the claimed size after announcing itself), and any shutdown
    // that began before it. A local push is ordered against a shutdown by
    // its light_fence and the shutdown's heavy_fence (barrier.hpp).
    const PoolState st = life_.state(std::memory_order_seq_cst);
    if (st != PoolState::running) [[unlikely]] {
      if (st >= PoolState::stopping) on_push_after_close();
      return;
    }
    if (own_queue ? idle_.spinning() != 0 : idle_.spinner_running()) return;
    wake_for_push();
  }

  // The ring of the calling thread's home shard at `level`
  // (producer_index()), or null if that shard has a spill queue.
  [[nodiscard]] Ring* home_ring(std::size_t level) const noexcept {
    return rings_[level * (shard_mask_ + 1) + (producer_index() & shard_mask_)];
  }

  // Unique per pool; a worker takes them from a block it reserved, so that
  // tasks forked on different workers do not contend on one counter.
  std::uint64_t new_task_id() noexcept {
    static constexpr std::uint64_t kIdBlock = 256;
    if (t_current.core != this) return next_id_.fetch_add(1, std::memory_order_relaxed) + 1;
    CurrentWorker& cur = t_current;
    if (cur.next_id == cur.end_id) {
      cur.next_id = next_id_.fetch_add(kIdBlock, std::memory_order_relaxed) + 1;
      cur.end_id = cur.next_id + kIdBlock;
    }
    return cur.next_id++;
  }

  // ---- implementation (src/) ----

  // pool_core.cpp
  // The one place the pool's state changes (asserts the edge is legal).
  void set_state(PoolState to) noexcept;
  bool transition(PoolState from, PoolState to) noexcept;  // compare-exchange
  void grow() noexcept;
  // grow() once per queued task, up to max_workers.
  void grow_for_queued() noexcept;
  // wake.cpp: a push that found no spinner running, handed to the
  // engine's WakePolicy (src/engine/wake_policy.hpp).
  void wake_for_push() noexcept;
  // run.cpp
  bool run_claimed(Worker* w, TaskStateBase* s, bool top_level, bool drop_ref) noexcept;
  // supervisor.cpp: the submission path's calls into the Supervisor (a
  // queue deadline armed, or disarmed when its task left the queue).
  void arm_queue_deadline(TaskStateBase* s);
  void disarm_timer(TaskStateBase* s) noexcept;
  // shutdown.cpp: a push that saw the pool stopping, handed to the
  // ShutdownSequence (a running shutdown sweeps the cell; after one has
  // finished, the submitter runs or rejects it here).
  void on_push_after_close() noexcept;
};

inline void InlineRunner::count_outcome(TaskStatus outcome) noexcept { c_.count_outcome(outcome); }

}  // namespace crew::detail

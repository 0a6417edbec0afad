// crew/pool_types.hpp: the pool's options, states, statistics and reports.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "crew/overload.hpp"
#include "crew/task_status.hpp"

namespace crew {

class Observer;  // crew/observer.hpp
class Logger;    // crew/log.hpp

// queue_capacity value for a queue without a bound.
inline constexpr std::size_t kUnbounded = static_cast<std::size_t>(-1);

// What a blocking submission does when the queue is full.
enum class Overflow : std::uint8_t {
  block,        // wait until the queue (the task's priority level) has drained
                // to half its capacity, then queue (bounded by max_blocked_submitters)
  reject,       // refuse with Admission::full
  caller_runs,  // run the task on the submitting thread
};

// Ordered from the gentlest to the hardest (a harder one escalates a gentler one).
enum class ShutdownMode : std::uint8_t {
  drain,  // refuse new tasks; run everything queued and running ("light")
  soft,   // refuse new tasks; running tasks finish; queued ones are rejected
  hard,   // queued tasks rejected; running long tasks get their tokens stopped
};

// new -> running <-> paused -> stopping -> stopped | stopped_timeout;
// restart(): stopped | stopped_timeout -> running.
enum class PoolState : std::uint8_t {
  created,
  running,
  paused,
  stopping,
  stopped,
  stopped_timeout
};

// starting -> idle <-> busy -> stopping -> stopped, or abandoned (see
// is_legal_transition below).
enum class WorkerState : std::uint8_t { starting, idle, busy, stopping, stopped, abandoned };

enum class WorkerStop : std::uint8_t { graceful, hard };

// Why a worker is stopping or stopped (WorkerInfo::stop_reason,
// Observer::on_worker_stopped).
enum class WorkerStopReason : std::uint8_t {
  none,               // it is not stopping
  idle_expired,       // idle for idle_timeout above min_workers
  resized,            // resize() lowered max_workers below the live workers
  stop_worker,        // Pool::stop_worker asked this one to leave
  shutdown,           // the pool shut down
  root_token,         // PoolOptions::stop_token was stopped (a hard shutdown)
  start_hook_failed,  // on_worker_start threw; the pool starts a replacement
  written_off,        // its task ignored its stop past abandon_grace; replaced
};

// How the operating system schedules the pool's worker threads.
enum class WorkerPolicy : std::uint8_t {
  // The system's default (Linux SCHED_OTHER): a worker woken for a task
  // preempts the thread running on the CPU the kernel puts it on, if that
  // thread has run longer.
  normal,
  // Linux SCHED_BATCH, same nice value: a woken worker does not preempt; it
  // runs when the thread on its CPU waits or its time slice ends. For a
  // pool fed by threads that have other work to do on a machine whose CPUs
  // are all busy (an event loop handing CPU work over): the submitter keeps
  // its CPU and serves more before the worker runs, at the cost of the
  // tasks' start latency (up to a time slice, milliseconds). Elsewhere than
  // Linux, the same as normal.
  batch,
};

// The only legal transitions. A transition to the same state is a no-op and
// always legal.
[[nodiscard]] constexpr bool is_legal_transition(PoolState from, PoolState to) noexcept {
  using S = PoolState;
  if (from == to) return true;
  switch (from) {
    case S::created:
      return to == S::running;
    case S::running:
      return to == S::paused || to == S::stopping;
    case S::paused:
      return to == S::running || to == S::stopping;
    case S::stopping:
      return to == S::stopped || to == S::stopped_timeout;
    case S::stopped:
    case S::stopped_timeout:
      return to == S::running;  // restart()
  }
  return false;
}

// A worker is busy while it finds tasks and idle once the queue runs dry.
// `abandoned` is reached from busy (a hung task) and, when a shutdown has to
// give up on a thread stuck in a start or stop hook, from starting or
// stopping.
[[nodiscard]] constexpr bool is_legal_transition(WorkerState from, WorkerState to) noexcept {
  using S = WorkerState;
  if (from == to) return true;
  switch (from) {
    case S::starting:
      return to == S::idle || to == S::stopping || to == S::abandoned;
    case S::idle:
      return to == S::busy || to == S::stopping;
    case S::busy:
      return to == S::idle || to == S::stopping || to == S::abandoned;
    case S::stopping:
      return to == S::stopped || to == S::abandoned;
    case S::stopped:
    case S::abandoned:
      return false;
  }
  return false;
}

[[nodiscard]] std::string_view to_string(Overflow v) noexcept;
[[nodiscard]] std::string_view to_string(ShutdownMode v) noexcept;
[[nodiscard]] std::string_view to_string(PoolState v) noexcept;
[[nodiscard]] std::string_view to_string(WorkerState v) noexcept;
[[nodiscard]] std::string_view to_string(WorkerStop v) noexcept;
[[nodiscard]] std::string_view to_string(WorkerPolicy v) noexcept;
[[nodiscard]] std::string_view to_string(WorkerStopReason v) noexcept;

// Identifies a task in reports and callbacks. Unnamed fire-and-forget short
// tasks have id 0 and no name.
struct TaskRef {
  std::uint64_t id = 0;
  std::string name;
  std::string correlation_id;  // TaskOptions::correlation_id
  friend bool operator==(const TaskRef&, const TaskRef&) = default;
};

// Durations here and in TaskOptions may be as large as nanoseconds::max():
// a deadline past the clock's range means "never", it does not wrap.
struct PoolOptions {
  // Shown in thread names ("<name>-<worker id>", cut to 15 bytes), logs, metrics.
  std::string name = "crew";
  // Workers kept even when idle; started with the pool.
  std::size_t min_workers = 0;
  // Upper bound of workers; 0 means 2 x crew::usable_cpus() (the affinity
  // mask capped by the cgroup CPU quota, crew/usable_cpus.hpp).
  std::size_t max_workers = 0;
  // Queued tasks at most; 0 means 1000 x usable CPUs; kUnbounded for none.
  // Each shard (below) holds its share in a lock-free ring of up to 65,536
  // slots (64 bytes each) whose pages are touched only as they are used;
  // beyond that, in a spill queue of blocks with one lock for pushes and one
  // for pops. From a ring of 256 slots or more a worker takes up to 8 tasks
  // at a time, the first to run and the rest into its own queue (other
  // workers steal them from there); those 7 per worker no longer count
  // against the capacity, so with the defaults up to 1.4 % more tasks may be
  // queued in all. Smaller shares keep the capacity exact.
  std::size_t queue_capacity = 0;
  // The queue is split into shards so that concurrent submitters do not
  // contend on one tail; order is FIFO per submitting thread. 0 picks one
  // shard per usable CPU (at least 4, at most 64); 1 gives a single
  // queue, FIFO across all submitters. Rounded down to a power of two and
  // to at most queue_capacity.
  std::size_t queue_shards = 0;
  // Priority levels: 1 (the default) means none. With n > 1, a task's
  // TaskOptions::priority is 0 (lowest) .. n-1 (highest); higher levels run
  // first, and a waiting lower level is served after `priority_aging` tasks
  // taken from above it by one worker (see docs/api.md, "Priorities").
  // queue_capacity applies to each level.
  std::size_t priority_levels = 1;
  std::uint32_t priority_aging = 16;
  Overflow overflow = Overflow::block;
  // Callers that may wait in a blocking submission at once; further ones get
  // Admission::too_many_blocked. 0 means no limit.
  std::size_t max_blocked_submitters = 0;
  // Workers above min_workers exit after idling this long.
  std::chrono::nanoseconds idle_timeout = std::chrono::seconds(10);
  // Default execution deadline of long tasks; 0 means none.
  std::chrono::nanoseconds task_timeout{0};
  // What the destructor does, and shutdown() without arguments: a drain
  // bounded by shutdown_timeout, then hard (queued tasks rejected, long
  // tasks' tokens stopped, abandon_grace for the rest). Bounded by default
  // so that no task can hold a plain ~Pool forever; 0 = no limit before
  // escalating (`.shutdown_timeout = std::chrono::nanoseconds{0}`, the
  // default before 10 s). docs/shutdown.md says why drain and why 10 s.
  ShutdownMode shutdown_mode = ShutdownMode::drain;
  std::chrono::nanoseconds shutdown_timeout = std::chrono::seconds(10);
  // After a hard stop (or a missed deadline), how long a task may keep running
  // before its worker is written off and replaced.
  std::chrono::nanoseconds abandon_grace = std::chrono::seconds(1);
  // When stopped, the pool shuts down hard by itself.
  std::stop_token stop_token{};
  // Receives exceptions of tasks nobody holds a handle to, also of a long
  // task that threw after its stop or deadline (it counts as cancelled or
  // timed out). Without it they are written to stderr with the task's
  // name. Must not throw. Runs on the thread that ran the task (a worker,
  // or the submitter for caller_runs); not for a task whose worker was
  // written off (its run is over for the pool, see abandon_grace).
  std::function<void(const TaskRef&, std::exception_ptr)> on_exception{};
  // Run on each worker thread as it starts and before it exits. A start hook
  // that throws kills the worker; the pool replaces it (with backoff).
  //
  // Until when user code can run: every callback here (handlers, hooks,
  // observers, the logger) runs on a thread of the pool or a submitter.
  // A thread the pool wrote off (its task or hook ignored the stop past
  // abandon_grace) starts no callback once it sees that: its late exception
  // is not reported, its stop hook does not run, and written off in its start
  // hook it never serves a task. Others start before the destructor returns;
  // one the thread was in when written off, or was about to start while
  // preempted for about abandon_grace, may run after it (crew/observer.hpp).
  std::function<void(std::uint64_t worker_id)> on_worker_start{};
  std::function<void(std::uint64_t worker_id)> on_worker_stop{};
  // Told about tasks, workers and state changes (crew/observer.hpp).
  std::vector<std::shared_ptr<Observer>> observers{};
  // Where the pool logs task exceptions without a handler, worker
  // replacement and abandonment, and shutdown summaries (crew/log.hpp).
  // Empty: crew::default_logger(), which writes to stderr.
  std::shared_ptr<Logger> logger{};
  // How long an idle worker polls the queue before it sleeps (time it spends
  // off its CPU, preempted, does not count). Longer spins catch bursts
  // without a wake-up (~10 us each) at the cost of CPU after work.
  // At most usable CPUs / 2 workers (none with one) spin at once in the
  // process; a worker woken onto the CPU of the thread that woke it does not
  // spin; a spinner that lost its CPU for more than 10 us is not relied on:
  // tasks submitted meanwhile wake a sleeping worker (docs/design/wake-ups.md,
  // "Waking workers without losing a wake-up").
  std::chrono::nanoseconds spin = std::chrono::microseconds(50);
  // Whether idle workers spin for the whole `spin` also while the
  // machine's CPUs are contended: while some runnable thread of any process
  // waits for a CPU most of the time (on Linux, from /proc/pressure/cpu,
  // read at most every 4 ms by a worker about to spin). By default a spin
  // then lasts at most 5 us, about what a wake-up costs: a longer one takes
  // the CPU from threads that would make progress, often the ones that
  // submit the next task. Set it for workers on CPUs reserved for them,
  // where the measure reflects other CPUs. Without the pressure file the
  // CPUs never count as contended (docs/design/wake-ups.md, "Spinning on a
  // contended machine").
  bool spin_when_contended = false;
  // Stack size of each worker thread in bytes; 0 means the system default
  // (the RLIMIT_STACK soft limit, 8 MiB on most Linux systems). Otherwise at
  // least kMinStackSize; rounded up to whole pages. Nested waits keep the
  // stack bounded by the depth of the program's own recursion (docs/api.md,
  // "Fork-join"), so divide-and-conquer needs no more than its depth.
  std::size_t stack_size = 0;
  static constexpr std::size_t kMinStackSize = std::size_t{64} << 10;
  static constexpr std::size_t kMaxStackSize = std::size_t{1} << 30;
  // How the system schedules worker threads (see WorkerPolicy). Set by each
  // worker on itself before on_worker_start; if the system refuses, the
  // worker keeps the default and the pool logs a warning once.
  WorkerPolicy worker_policy = WorkerPolicy::normal;
  // The overload controller: adaptive admission limit and CoDel dequeue
  // drop (crew/overload.hpp). Off by default.
  OverloadOptions overload{};
  // Task starts per second at most, across the workers (a token bucket:
  // up to `start_burst` at once, 0 meaning 1); 0: no limit. A worker takes
  // a token before it takes a task, so while none is due the tasks stay
  // queued and the workers hold none: one of them sleeps until the next
  // token, the others as idle workers do. Not paced: tasks a waiting
  // caller runs itself (Task::wait, Group::wait on a worker,
  // run_pending_task), caller_runs, and what a shutdown drops.
  double max_start_rate = 0;
  std::size_t start_burst = 0;
  // Task handles show their queue wait and run time (Task::queue_wait(),
  // run_time(), run_batch's Outcome): the pool reads the clock at the
  // submission of every task with a handle and at the end of its run,
  // which costs a task-per-handle workload measurably (crew_bench's
  // short_future, docs/api.md). Off, the handles show 0, unless an
  // observer wants task timings: the pool reads the clock then anyway.
  bool time_tasks = false;
};

namespace detail {

// The field of an outcome tally that counts `status`, or null for a status
// that is not an outcome (queued, running). For OutcomeCounts and for the
// pool's own counters, which have the same fields.
template <class Counts>
constexpr auto outcome_field(Counts& c, TaskStatus status) noexcept -> decltype(&c.succeeded) {
  switch (status) {
    case TaskStatus::succeeded:
      return &c.succeeded;
    case TaskStatus::failed:
      return &c.failed;
    case TaskStatus::cancelled:
      return &c.cancelled;
    case TaskStatus::timed_out:
      return &c.timed_out;
    case TaskStatus::rejected:
      return &c.rejected;
    case TaskStatus::shed:
      return &c.shed;
    case TaskStatus::queued:
    case TaskStatus::running:
      break;
  }
  return nullptr;
}

}  // namespace detail

struct OutcomeCounts {
  std::uint64_t succeeded = 0;
  std::uint64_t failed = 0;
  std::uint64_t cancelled = 0;
  std::uint64_t timed_out = 0;
  std::uint64_t rejected = 0;
  std::uint64_t shed = 0;  // dropped unrun by the overload controller
  [[nodiscard]] std::uint64_t total() const noexcept {
    return succeeded + failed + cancelled + timed_out + rejected + shed;
  }
  // Counts one task that ended with `status` (queued and running count
  // nothing).
  constexpr void add(TaskStatus status) noexcept {
    if (std::uint64_t* field = detail::outcome_field(*this, status)) ++*field;
  }
  constexpr OutcomeCounts& operator+=(const OutcomeCounts& more) noexcept {
    succeeded += more.succeeded;
    failed += more.failed;
    cancelled += more.cancelled;
    timed_out += more.timed_out;
    rejected += more.rejected;
    shed += more.shed;
    return *this;
  }
};

struct PoolStats {
  PoolState state = PoolState::created;
  std::size_t workers = 0;  // live (not abandoned)
  std::size_t idle = 0;
  std::size_t busy = 0;
  std::size_t max_workers = 0;
  // Cells in the shared and the worker-local queues. A task that a waiting
  // worker ran itself (Task::get/wait on a task it had queued) leaves its
  // cell behind until a worker pops and drops it, so this can briefly count
  // tasks that have already ended; so can the step of a forked child
  // (crew::fork) that its join ran (wait_idle() does not wait for those).
  std::size_t queued = 0;
  std::size_t blocked_submitters = 0;
  std::uint64_t submitted = 0;  // every submission, accepted or not
  OutcomeCounts outcomes;       // tasks that ended
  std::uint64_t abandoned = 0;  // tasks written off (also counted in outcomes)
  std::uint64_t workers_replaced = 0;
  // Queued tasks taken by Pool::run_pending_task() (a waiting caller helping,
  // crew::Group::wait and Task::wait on a worker among them) rather than by a
  // worker's own loop.
  std::uint64_t helped = 0;
  OverloadStats overload;  // the overload controller's view (zero when off)
};

struct WorkerInfo {
  std::uint64_t id = 0;
  WorkerState state = WorkerState::starting;
  // The task running now, when it has a handle, a name or a deadline (plain
  // fire-and-forget short tasks show as busy with task id 0).
  TaskRef task;
  // Since the running task started: long tasks, tasks with a handle in a
  // pool that times them (time_tasks), and tasks with a handle or a name in
  // a pool whose observers time tasks; 0 for the others.
  std::chrono::nanoseconds running_for{0};
  // How far the running task is past its execution deadline (a long task's
  // timeout); 0 without one or before it. Such a task keeps its worker until
  // it returns or is written off abandon_grace after its stop.
  std::chrono::nanoseconds overdue_for{0};
  // Why it is leaving, from the moment it decided to (its state turns
  // stopping right after); none before.
  WorkerStopReason stop_reason = WorkerStopReason::none;
};

struct ShutdownReport {
  ShutdownMode mode = ShutdownMode::drain;
  bool escalated = false;  // the timeout expired and the pool went hard
  PoolState final_state = PoolState::stopped;
  std::chrono::nanoseconds elapsed{0};
  OutcomeCounts during;    // outcomes decided while this shutdown ran
  OutcomeCounts lifetime;  // all outcomes since the pool was created
  // Tasks the shutdown affected, for compensation by a stateful service.
  std::vector<TaskRef> rejected;   // dropped from the queue
  std::vector<TaskRef> cancelled;  // stopped by the hard phase
  std::vector<TaskRef> timed_out;  // missed their deadline during the shutdown
  std::vector<TaskRef> abandoned;  // still running when the grace ended
  // Plain fire-and-forget tasks (no handle, no name) are counted, not listed.
  std::uint64_t rejected_unnamed = 0;   // dropped from the queue
  std::uint64_t abandoned_unnamed = 0;  // still running when the grace ended
};

}  // namespace crew

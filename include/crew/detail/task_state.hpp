// crew/detail/task_state.hpp: the shared state behind a Task handle, a long
// task, a named task or a task with a queue deadline.
//
// Ownership: reference counted. The queue cell holds one reference until the
// task is popped and settled; each Task handle holds one; the pool's timer
// heap holds one while a queue deadline is armed. The status word and the
// count, with the steps that give every task exactly one outcome, are its
// base, TaskWord (task_word.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>

#include "crew/detail/assert.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/task_word.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "crew/error.hpp"
#include "crew/task_status.hpp"

namespace crew {
struct TaskContext;
}

namespace crew::detail {

class PoolCore;

// A callable that derives from this is told when its task expires in the
// queue, before the pool destroys it: TaskStateBase::expire() calls its
//   void on_queue_expired() noexcept;
// on the pool's supervisor thread, at the queue deadline, once the outcome
// is decided (the callable will never run) and counted, and before anyone
// sees it: no other thread touches the callable then. It must not block:
// every deadline of the pool waits for it. The supervisor destroys the
// callable right after. crew::asio completes a submission there, so that
// an expired task is answered at its deadline, not when a worker reaches it.
struct QueueExpiryListener {};

// Why a running long task's token was stopped. The first reason wins.
enum class StopReason : std::uint8_t { none, cancelled, timed_out, shutdown };

// What TaskStateBase::request_stop did.
enum class StopRequest : std::uint8_t {
  signalled,  // the task runs: its token is stopped, it ends as the reason says
  recorded,   // the task has not started to run: it starts with its token stopped
  too_late,   // its callable returned and its outcome is decided: nothing changed
};

// The stop source a long task runs under. A worker keeps one for its
// top-level tasks and reuses it until a stop is requested through it; nested
// and caller-thread runs get their own.
struct RunFrame {
  // Created on first use (a stop_source allocates its state) and reused.
  std::stop_source source{std::nostopstate};
  bool poisoned = false;  // a stop was requested: replace `source` before reuse
  // steady_clock nanoseconds of the first stop request on the current task
  // (0 = none); the supervisor abandons the task `abandon_grace` after it.
  std::atomic<std::int64_t> stop_at_ns{0};
  PoolCore* core = nullptr;  // whose supervisor to wake on a stop request
};

// A task's times in one word, so that the common state stays 64 bytes:
// its enqueue time (steady_clock nanoseconds; 0 when nobody asked for it)
// until the task ends, then its queue wait and run time. A duration is
// kept in 31 bits, a 26-bit mantissa and a 5-bit exponent: exact below
// 2^26 ns (67 ms), within 2^-26 of itself above, saturating at 4.5 years.
// The submitter writes the enqueue time before the task is shared; the
// thread that decides the outcome writes the durations before it publishes
// it; the handle reads them once the outcome is published (Task::
// queue_wait). Relaxed atomics, never a torn word.
class TaskClock {
 public:
  // `shown`: the handle shows the durations (PoolOptions::time_tasks, or
  // observers that want timings). Else the time is for the overload
  // controller's queue-wait sample alone, and the durations stay 0.
  void set_enqueued(std::int64_t ns, bool shown = true) noexcept {
    word_.store(static_cast<std::uint64_t>(ns) | (shown ? kShown : 0), std::memory_order_relaxed);
  }
  // The enqueue time; 0 if the task was not clocked or has ended.
  [[nodiscard]] std::int64_t enqueued_ns() const noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    return (w & kEnded) != 0 ? 0 : static_cast<std::int64_t>(w & ~kShown);
  }
  // The task left the queue at `start` and ended at `end` (equal for one
  // that never ran); nothing for a task that was not clocked.
  void record(std::int64_t start, std::int64_t end) noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    if (w == 0 || (w & kEnded) != 0) return;
    const auto enqueued = static_cast<std::int64_t>(w & ~kShown);
    word_.store((w & kShown) == 0
                    ? kEnded
                    : kEnded | (pack(start - enqueued) << kFieldBits) | pack(end - start),
                std::memory_order_relaxed);
  }
  // 0 until record(), and for a task whose durations are not shown.
  [[nodiscard]] std::chrono::nanoseconds queue_wait() const noexcept { return unpack(kFieldBits); }
  [[nodiscard]] std::chrono::nanoseconds run_time() const noexcept { return unpack(0); }

 private:
  static constexpr std::uint64_t kEnded = std::uint64_t{1} << 63;
  // Set with the enqueue time (bit 62: steady_clock nanoseconds stay below
  // it for 146 years of uptime); the durations use bits 0-61.
  static constexpr std::uint64_t kShown = std::uint64_t{1} << 62;
  static constexpr unsigned kFieldBits = 31;
  static constexpr unsigned kMantissaBits = 26;
  static constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << kFieldBits) - 1;
  static constexpr std::uint64_t kMantissaMask = (std::uint64_t{1} << kMantissaBits) - 1;
  static std::uint64_t pack(std::int64_t ns) noexcept {
    if (ns <= 0) return 0;
    const auto v = static_cast<std::uint64_t>(ns);
    const auto width = static_cast<unsigned>(std::bit_width(v));
    const unsigned shift = width > kMantissaBits ? width - kMantissaBits : 0;
    if (shift >= (1u << (kFieldBits - kMantissaBits))) return kFieldMask;
    return (std::uint64_t{shift} << kMantissaBits) | (v >> shift);
  }
  [[nodiscard]] std::chrono::nanoseconds unpack(unsigned at) const noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    if ((w & kEnded) == 0) return std::chrono::nanoseconds{0};
    const std::uint64_t f = (w >> at) & kFieldMask;
    return std::chrono::nanoseconds(
        static_cast<std::int64_t>((f & kMantissaMask) << (f >> kMantissaBits)));
  }

  std::atomic<std::uint64_t> word_{0};
};

// What a task's callable leaves for after its outcome is published: the
// thread that runs a task (PoolCore::run_claimed, the only caller of
// TaskStateBase::run) runs the entries deferred during the run once it
// has published the outcome and counted it, last deferred first. Only
// from inside a callable the pool runs; the entry, and what `fire` needs,
// must live until it fires (crew::asio: a completion posted once the
// handle shows the outcome, its node freeing itself). Per thread.
struct AfterOutcome {
  void (*fire)(AfterOutcome*) noexcept = nullptr;
  AfterOutcome* next = nullptr;
};
// initial-exec: the pool's run path reads it after every task, and the
// default model of position-independent code (crew is built so) is a call
// to __tls_get_addr per read (factorial in crew_bench: 3-4 % slower).
inline thread_local AfterOutcome* t_after_outcome [[gnu::tls_model("initial-exec")]] = nullptr;
inline void defer_after_outcome(AfterOutcome* a) noexcept {
  a->next = t_after_outcome;
  t_after_outcome = a;
}
// run_claimed, after the publication.
inline void run_after_outcome() noexcept {
  if (t_after_outcome == nullptr) [[likely]]
    return;
  while (AfterOutcome* a = t_after_outcome) {
    t_after_outcome = a->next;
    a->fire(a);
  }
}

class TaskStateBase;
// Settles a task whose outcome claim_in_queue decided (src/engine/task.cpp): its
// callable is destroyed, its queue deadline disarmed, the pool counts it
// (unless `count` is false: it was counted already, as a refusal), and the
// outcome is published. Runs on the deciding thread; it holds a reference.
void settle_in_queue(TaskStateBase* s, bool count) noexcept;

// A task's shared state: the status word (TaskWord, task_word.hpp), its
// ownership (release, finish_and_release), what the task is (its
// callable's hooks, id, owner, clock, error, Extras) and its stop.
class TaskStateBase : public TaskWord {
 public:
  static constexpr std::size_t kNotInHeap = static_cast<std::size_t>(-1);
  static constexpr auto kNoDeadline = std::chrono::steady_clock::time_point::max();
  // Extras::admission.
  static constexpr std::uint8_t kAdmitted = 0;
  static constexpr std::uint8_t kAdmitting = 1;
  static constexpr std::uint8_t kExpiryDeferred = 2;

  TaskStateBase() noexcept = default;
  TaskStateBase(const TaskStateBase&) = delete;
  TaskStateBase& operator=(const TaskStateBase&) = delete;
  virtual ~TaskStateBase() = default;

  // States of up to 512 bytes come from and return to a small per-thread
  // cache of freed blocks (crew/detail/block_cache.hpp): a fork-join node
  // frees its children's states in bursts that glibc's own cache does not
  // hold. The aligned forms (a result type aligned beyond the default) use
  // the heap.
  static void* operator new(std::size_t size);
  static void operator delete(void* p, std::size_t size) noexcept;
  static void* operator new(std::size_t size, std::align_val_t align) {
    return ::operator new(size, align);
  }
  static void operator delete(void* p, std::size_t /*size*/, std::align_val_t align) noexcept {
    ::operator delete(p, align);
  }

  // Runs the callable and stores its result; exceptions propagate.
  virtual void run(const TaskContext& ctx) = 0;

  // A sole holder (count 1) frees without the read-modify-write: nobody
  // else can take a reference to a state only it holds (add_ref on a
  // pointer found in a worker's run slot, the foreign-run set or the timer
  // heap happens while the running or arming thread still holds one). The
  // acquire load pairs with the other holders' releasing decrements. Most
  // often the last holder is a Task handle, after the runner dropped the
  // queue's reference.
  void release() noexcept {
    if (refs(word_.load(std::memory_order_acquire)) == 1 ||
        refs(word_.fetch_sub(kOneRef, std::memory_order_acq_rel)) == 1) {
      delete this;
    }
  }

  // queued -> running | cancelled | rejected. False if it had already left
  // `queued`. An outcome decided here (cancelled, rejected) is settled by
  // the calling thread before anyone can see it (settle_in_queue): the
  // pool counts it, its queue deadline is disarmed and its callable is
  // destroyed, then waiters wake. The caller holds a reference.
  bool leave_queue(TaskStatus to, Errc why = Errc{}) noexcept {
    if (to != TaskStatus::running) {
      if (!claim_in_queue(to, why)) return false;
      settle_in_queue(this, /*count=*/true);
      return true;
    }
    std::uint64_t cur = word_.load(std::memory_order_relaxed);
    for (;;) {
      if ((cur & kStatusMask) != static_cast<std::uint32_t>(TaskStatus::queued)) return false;
      const std::uint64_t next =
          (cur & (kRefMask | kWaitersBit)) | encode(TaskStatus::running, why) | kRanBit;
      if (word_.compare_exchange_weak(cur, next, std::memory_order_acq_rel)) return true;
    }
  }
  // Destroys the callable of a task that will never run (TaskState).
  virtual void discard_callable() noexcept {}

  // queued -> rejected(expired) when the queue deadline passes (the
  // supervisor, holding the timer heap's reference), settled as
  // leave_queue does, with the callable's on_queue_expired() (if it asked
  // for it: QueueExpiryListener) after the pool counted the task and before
  // the callable is destroyed. False if the task had already left `queued`:
  // nothing is called then. In src/engine/task.cpp.
  bool expire() noexcept;
  // queued -> shed (Errc::overloaded) by the overload controller (the
  // worker that popped the task), settled as expire() is, with the
  // callable's on_queue_shed(why) (if it has one) after the task is
  // counted and before the callable is destroyed. False if it had already
  // left `queued`. In src/engine/task.cpp.
  bool shed(OverloadReason why) noexcept;
  // The queue deadline while the submission is being routed (admit_state),
  // before the task is counted as submitted: a deadline that passes then is
  // not the supervisor's to fire (an outcome counted before its submission
  // breaks outcomes <= submitted; a refusal would then end expired and be
  // counted twice). The supervisor hands it over instead (defer_expiry),
  // and the submitter fires it once the submission is counted
  // (end_admission). One of the two fires it: the hand-over is one atomic.
  // Only for a task with a queue deadline (it has Extras).
  void begin_admission() noexcept {
    extras_->admission.store(kAdmitting, std::memory_order_relaxed);  // published by arming
  }
  // Whether a queue deadline was set and has passed: a thread about to
  // start the task expires it instead (expire()), so that a task never
  // starts after its queue deadline, however late the supervisor's timer
  // or the submitter's end_admission.
  [[nodiscard]] bool queue_deadline_passed() const noexcept {
    return extras_ != nullptr && extras_->queue_deadline != kNoDeadline &&
           std::chrono::steady_clock::now() >= extras_->queue_deadline;
  }
  // Supervisor, at the queue deadline: true if the submitter has not
  // finished admitting the task, which then expires it itself.
  bool defer_expiry() noexcept {
    std::uint8_t expected = kAdmitting;
    return extras_->admission.compare_exchange_strong(expected, kExpiryDeferred,
                                                      std::memory_order_acq_rel);
  }
  // Submitter, once the task is counted (queued, run here or refused):
  // whether its queue deadline passed meanwhile and is now its to fire.
  bool end_admission() noexcept {
    return extras_->admission.exchange(kAdmitted, std::memory_order_acq_rel) == kExpiryDeferred;
  }

  // finish(), then release() of the caller's reference, in one
  // read-modify-write when nobody waits on the word (with a waiter, the
  // wake-up needs the state alive: two steps, as before). The reference is
  // dropped even when the result is false. The caller must not touch the
  // state afterwards.
  bool finish_and_release(TaskStatus outcome, Errc why = Errc{}) noexcept {
    const std::uint64_t to = kRanBit | encode(outcome, why);
    std::uint64_t cur = word_.load(std::memory_order_relaxed);
    while ((cur & kWaitersBit) == 0) {
      if ((cur & kStatusMask) != static_cast<std::uint32_t>(TaskStatus::running)) break;
      CREW_ASSERT(refs(cur) != 0, "finish_and_release without a reference");
      if (word_.compare_exchange_weak(cur, (cur & kRefMask) - kOneRef + to,
                                      std::memory_order_acq_rel)) {
        if (refs(cur) == 1) delete this;
        return true;
      }
    }
    const bool finished = leave_running(static_cast<std::uint32_t>(to));
    release();
    return finished;
  }
  // Records why the task should stop and, if it runs now, stops its token;
  // unless its callable already returned (detach_runner), when the outcome
  // the runner decided stands. Under the stop lock, so that the two cannot
  // both miss each other.
  StopRequest request_stop(StopReason why) noexcept CREW_EXCLUDES(stop_mu_);
  // Told after request_stop recorded a stop that was not too late, on the
  // requesting thread, outside the stop lock, while that thread holds a
  // reference: a coroutine task wakes its suspension and stops its
  // children here (src/coro/coro_task.cpp). Must not block.
  virtual void stop_requested_hook() noexcept {}
  // Records only the reason (the first one wins), for a stop whose token is
  // stopped later on another thread (see PoolRuntime::stops).
  void note_stop_reason(StopReason why) noexcept {
    StopReason none = StopReason::none;
    stop_reason_.compare_exchange_strong(none, why, std::memory_order_acq_rel);
  }

  // Called by the thread running a long task around its execution.
  // detach_runner returns the stop reason its outcome is decided from: a
  // request_stop after it is too late.
  void attach_runner(RunFrame* frame) noexcept CREW_EXCLUDES(stop_mu_);
  StopReason detach_runner() noexcept CREW_EXCLUDES(stop_mu_);

  [[nodiscard]] StopReason stop_reason() const noexcept {
    return stop_reason_.load(std::memory_order_acquire);
  }

  // What only some tasks carry, in a block of its own so that the common
  // state (a short task with a handle) stays 64 bytes: allocated at
  // submission for a task with a name, a correlation id, a queue deadline
  // or an execution deadline, and for every long task (its runner link).
  struct Extras {
    // From the block cache, like the state (src/base/block_cache.cpp).
    static void* operator new(std::size_t size);
    static void operator delete(void* p, std::size_t size) noexcept;

    std::string name;
    std::string correlation_id;           // TaskOptions::correlation_id
    std::chrono::nanoseconds timeout{0};  // execution deadline after start; 0 = none
    std::chrono::steady_clock::time_point queue_deadline = kNoDeadline;
    // Owned by the pool's timer heap (guarded by its mutex). A task is in
    // the heap at most once: for its queue deadline while queued, or for
    // its execution deadline while it runs on a thread that is not a
    // worker; either way it has Extras.
    std::size_t heap_index = kNotInHeap;
    // The frame of the thread running this long task, guarded by the
    // state's stop lock (attach_runner, detach_runner, request_stop).
    RunFrame* runner = nullptr;
    // The callable returned (detach_runner): stop requests come too late.
    // Guarded by the stop lock too.
    bool run_over = false;
    // The queue deadline's hand-over at admission (begin_admission).
    std::atomic<std::uint8_t> admission{kAdmitted};
  };
  // Before the state is shared: the Extras its submitter made (made first,
  // so that a failed allocation of either leaks nothing), or none.
  void adopt_extras(std::unique_ptr<Extras> x) noexcept { extras_ = std::move(x); }
  // Null for a task that has none (most short tasks).
  [[nodiscard]] Extras* extras() const noexcept { return extras_.get(); }
  [[nodiscard]] const std::string& name() const noexcept {
    static const std::string kNoName;
    return extras_ ? extras_->name : kNoName;
  }
  [[nodiscard]] const std::string& correlation_id() const noexcept {
    static const std::string kNone;
    return extras_ ? extras_->correlation_id : kNone;
  }
  [[nodiscard]] std::chrono::nanoseconds timeout() const noexcept {
    return extras_ ? extras_->timeout : std::chrono::nanoseconds{0};
  }
  // What is left of its queue timeout, in nanoseconds (at least 1); 0
  // without one.
  [[nodiscard]] std::int64_t queue_timeout_left_ns() const noexcept {
    if (!has_queue_deadline()) return 0;
    const auto left = extras_->queue_deadline - std::chrono::steady_clock::now();
    return std::max<std::int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(left).count(), 1);
  }
  [[nodiscard]] bool has_queue_deadline() const noexcept {
    return extras_ && extras_->queue_deadline != kNoDeadline;
  }
  [[nodiscard]] std::chrono::steady_clock::time_point queue_deadline() const noexcept {
    return extras_ ? extras_->queue_deadline : kNoDeadline;
  }

  // The data members are declared in this order so that they pack into
  // 56 bytes after the vtable pointer: the status word first (the runner's
  // and the waiters' line), the one-byte fields together.
 private:
 public:
  // Set at submission, immutable afterwards.
  std::uint64_t id = 0;
  PoolCore* owner = nullptr;  // the pool core that runs it (for nested waits)
  // Clocked at submission for a task with a handle in a pool with
  // PoolOptions::time_tasks, and for every task of a pool whose observers
  // want timings.
  TaskClock clock;
  // Written by the runner before finish(), read after done() says failed.
  std::exception_ptr error;

 private:
  std::unique_ptr<Extras> extras_;  // set before the state is shared

 public:
  bool is_long = false;
  bool detached = false;  // no handle: exceptions go to the pool's handler
  Admission refused_as = Admission::accepted;
  // One byte, so that the common fields stay 64 bytes: the priority level
  // (bits 0-3, set at submission), why the overload controller refused
  // (with refused_as) or shed it (bits 4-6, written before the outcome is
  // published), and whether the cell holds one of its admission tickets
  // (bit 7, set by PoolCore::admit_state before the push; the thread that
  // pops the cell returns it). Its writers are ordered (submission, push,
  // pop), never concurrent.
  [[nodiscard]] std::size_t level() const noexcept { return packed_ & kLevelMask; }
  void set_level(std::size_t l) noexcept { set_bits(kLevelMask, static_cast<std::uint8_t>(l)); }
  [[nodiscard]] OverloadReason overload_reason() const noexcept {
    return static_cast<OverloadReason>((packed_ & kReasonMask) >> 4);
  }
  void set_overload_reason(OverloadReason r) noexcept {
    set_bits(kReasonMask, static_cast<std::uint8_t>(static_cast<unsigned>(r) << 4));
  }
  [[nodiscard]] bool overload_ticket() const noexcept { return (packed_ & kTicketBit) != 0; }
  void set_overload_ticket(bool held) noexcept { set_bits(kTicketBit, held ? kTicketBit : 0); }

 private:
  static constexpr std::uint8_t kLevelMask = 0x0f;  // PopState::kMaxLevels is 16
  static constexpr std::uint8_t kReasonMask = 0x70;
  static constexpr std::uint8_t kTicketBit = 0x80;
  void set_bits(std::uint8_t mask, std::uint8_t bits) noexcept {
    packed_ = static_cast<std::uint8_t>((packed_ & ~mask) | (bits & mask));
  }
  std::uint8_t packed_ = 0;

 public:
  // The timer heap's entry stops a running task (else it expires a queued
  // one); guarded by the heap's mutex.
  bool timer_exec = false;

 protected:
  // ResultStateBase: the result was constructed (written by the runner
  // before finish(), read after done() or by the last holder).
  bool has_value_ = false;

 private:
  // expire()'s notice to the callable (TaskState forwards it).
  virtual void queue_expired() noexcept {}
  // shed()'s notice to the callable (TaskState forwards it).
  virtual void queue_shed(OverloadReason /*why*/) noexcept {}

  std::atomic<StopReason> stop_reason_{StopReason::none};
  SpinLock stop_mu_;
};

// The wait of a worker of the pool that owns `state`: until it ends or the
// deadline passes, runs queued tasks of the pool (its own local queue first,
// newest first) and `state` itself if it is still queued, so that a worker
// waiting for a subtask never deadlocks its pool and never idles while its
// own forked work is queued. Returns 1 if the task ended, 0 if the deadline
// passed, -1 if the caller is not such a worker (it must wait by itself).
int wait_as_worker(TaskStateBase* state, std::chrono::steady_clock::time_point deadline);
// True if the calling thread is a worker of the pool that owns `state`.
bool is_worker_of(const TaskStateBase* state) noexcept;

// The result in place, its presence in the base's has_value_ (a
// std::optional would add 8 bytes of padding for a word-sized result).
template <class R>
class ResultStateBase : public TaskStateBase {
 public:
  ResultStateBase() noexcept {}  // NOLINT(modernize-use-equals-default): storage_ stays raw
  ~ResultStateBase() override {
    if (has_value_) std::destroy_at(ptr());
  }
  // Called once, by the runner.
  template <class V>
  void set_value(V&& v) {
    std::construct_at(reinterpret_cast<R*>(storage_), std::forward<V>(v));
    has_value_ = true;
  }
  // After the task succeeded.
  [[nodiscard]] R& value() noexcept {
    CREW_ASSERT(has_value_, "no result");
    return *ptr();
  }

 private:
  // The constructed result (set_value made it).
  R* ptr() noexcept { return std::launder(reinterpret_cast<R*>(storage_)); }
  alignas(R) unsigned char storage_[sizeof(R)];
};
template <>
class ResultStateBase<void> : public TaskStateBase {};

template <class R, class F>
class TaskState final : public ResultStateBase<R> {
 public:
  template <class G>
  explicit TaskState(G&& g) {
    ::new (static_cast<void*>(&fn_)) F(std::forward<G>(g));
  }
  TaskState(const TaskState&) = delete;
  TaskState& operator=(const TaskState&) = delete;
  // The callable lives while the task is queued: run() ends it, and so
  // does the thread that decides an outcome in the queue
  // (discard_callable). No flag of its own, so the state keeps its size.
  ~TaskState() override {
    if (this->raw_status() == TaskStatus::queued) fn_.~F();
  }

  // Runs the callable once, and destroys it (and its captures) before the
  // runner publishes the outcome: nothing of a task runs after a wait for
  // it returned.
  void run(const TaskContext& ctx) override {
    struct End {
      TaskState* t;
      ~End() { t->fn_.~F(); }
    } end{this};
    if constexpr (std::is_void_v<R>) {
      call(ctx);
    } else {
      this->set_value(call(ctx));
    }
  }

 private:
  void discard_callable() noexcept override { fn_.~F(); }
  void queue_expired() noexcept override {
    if constexpr (std::is_base_of_v<QueueExpiryListener, F>) {
      static_assert(noexcept(fn_.on_queue_expired()), "on_queue_expired() must be noexcept");
      fn_.on_queue_expired();
    }
  }
  void queue_shed(OverloadReason why) noexcept override {
    if constexpr (requires(F & f) { f.on_queue_shed(why); }) {
      static_assert(noexcept(fn_.on_queue_shed(why)), "on_queue_shed() must be noexcept");
      fn_.on_queue_shed(why);
    }
  }
  decltype(auto) call(const TaskContext& ctx) {
    if constexpr (std::is_invocable_v<F&, const TaskContext&>) {
      return fn_(ctx);
    } else if constexpr (std::is_invocable_v<F&, std::stop_token>) {
      return fn_(stop_token_of(ctx));
    } else {
      (void)ctx;
      return fn_();
    }
  }
  static std::stop_token stop_token_of(const TaskContext& ctx);

  union {  // alive while queued (see ~TaskState)
    F fn_;
  };
};

}  // namespace crew::detail

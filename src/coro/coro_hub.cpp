// A pool's coroutine tasks: registry, timer, shutdown (coro_hub.hpp).
#include "coro_hub.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "crew/coro.hpp"
#include "crew/detail/clock.hpp"
#include "main_scheduling.hpp"
#include "thread_name.hpp"

namespace crew::detail {

namespace {
using Clock = std::chrono::steady_clock;
constexpr std::int64_t kPollFirstNs = 50'000;   // a polled task handle: first look
constexpr std::int64_t kPollMaxNs = 1'000'000;  // ... doubling up to this
constexpr std::int64_t kRetryNs = 50'000;       // a step that found the queue full
constexpr std::int64_t kSpinNs = 30'000;        // the timer yields, not sleeps, this close
// How long after a timer that a worker sleeps until the timer thread looks
// at it (SuspendedTasks): that worker fires it unless it was woken for
// other work meanwhile, and then, at its next idle moment, it fires it.
constexpr std::int64_t kBackstopNs = 500'000;
// The hub whose timer thread this is, if any.
thread_local const CoroHub* t_timer_hub = nullptr;
}  // namespace

bool CoroHub::on_timer_thread() const noexcept { return t_timer_hub == this; }

CoroHub& CoroHub::of(PoolCore& core) {
  if (SuspendedTasks* s = core.suspended()) return static_cast<CoroHub&>(*s);
  return static_cast<CoroHub&>(*core.install_suspended(std::make_unique<CoroHub>()));
}

CoroHub::~CoroHub() {
  std::vector<Entry> left;
  {
    std::lock_guard lock(timer_mu_);
    timer_stop_ = true;
    left.swap(heap_);
    publish_next();
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  for (Entry& e : left) {
    if (e.kind == Kind::retry || e.kind == Kind::retry_abandon) {
      // A claimed frame that never got its step: nothing else will end it.
      e.task->abandon(Errc::shutdown_dropped);
    }
    if (e.awaited != nullptr) e.awaited->release();
    e.task->drop();
  }
}

std::size_t CoroHub::this_thread_shard() noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kShards;
  return mine;
}

std::size_t CoroHub::live() const noexcept {
  std::size_t n = 0;
  for (const Shard& sh : shards_) n += sh.count.load(std::memory_order_acquire);
  return n;
}

bool CoroHub::none_live() noexcept {
  for (Shard& sh : shards_) {
    SpinLockGuard lock(sh.mu);
    if (sh.count.load(std::memory_order_relaxed) != 0) return false;
  }
  return true;
}

bool CoroHub::enroll(CoroTaskBase* t, bool from_coroutine) {
  const std::size_t i = this_thread_shard();
  Shard& sh = shards_[i];
  SpinLockGuard lock(sh.mu);
  if (!from_coroutine && closing_.load(std::memory_order_seq_cst)) return false;
  t->reg_shard = static_cast<std::uint8_t>(i);
  t->reg_prev = nullptr;
  t->reg_next = sh.head;
  if (sh.head != nullptr) sh.head->reg_prev = t;
  sh.head = t;
  sh.count.store(sh.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return true;
}

void CoroHub::leave(CoroTaskBase* t) noexcept {
  std::size_t left_in_shard = 0;
  {
    Shard& sh = shards_[t->reg_shard];
    SpinLockGuard lock(sh.mu);
    if (t->reg_prev != nullptr) {
      t->reg_prev->reg_next = t->reg_next;
    } else {
      sh.head = t->reg_next;
    }
    if (t->reg_next != nullptr) t->reg_next->reg_prev = t->reg_prev;
    t->reg_prev = t->reg_next = nullptr;
    left_in_shard = sh.count.load(std::memory_order_relaxed) - 1;
    sh.count.store(left_in_shard, std::memory_order_relaxed);
  }
  // A waiting shutdown read this shard's count under its lock after it
  // said it waits: either it saw this count, or this sees it waiting. (A
  // shard with tasks left: its last one looks.)
  if (left_in_shard == 0 && idle_waiters_.load(std::memory_order_acquire) != 0 && none_live()) {
    const std::lock_guard lock(idle_mu_);  // a waiter checks the count under it
    idle_cv_.notify_all();
  }
  t->drop();
}

void CoroHub::push(Entry e) {
  bool earliest = false;
  bool wake = false;
  {
    std::lock_guard lock(timer_mu_);
    if (!timer_.joinable()) {
      due_.reserve(kDueBatch);  // may throw, as may the thread
      timer_ = std::thread([this] { timer_loop(); });
    }
    heap_.push_back(e);  // may throw: nothing armed, nothing referenced yet
    std::push_heap(heap_.begin(), heap_.end(), Later{});
    earliest = heap_.front().at_ns == e.at_ns;
    if (earliest) publish_next();
    wake =
        earliest && timer_wakes_at_ != 0 && saturating_add(e.at_ns, kBackstopNs) < timer_wakes_at_;
    if (wake) timer_wakes_at_ = 0;  // one notify will do
  }
  if (wake) timer_cv_.notify_one();
}

void CoroHub::publish_next() noexcept {
  next_due_ns_.store(heap_.empty() ? 0 : heap_.front().at_ns, std::memory_order_relaxed);
}

void CoroHub::fire_due(std::int64_t now) noexcept {
  for (;;) {
    Entry e;
    {
      std::lock_guard lock(timer_mu_);
      if (heap_.empty() || heap_.front().at_ns > now) return;
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      e = heap_.back();
      heap_.pop_back();
      publish_next();
    }
    fire(e);
  }
}

void CoroHub::arm_wake(CoroTaskBase* t, std::uint64_t gen, std::int64_t at_ns) {
  t->hold();
  try {
    push(Entry{at_ns, Kind::wake, t, gen, nullptr, 0});
  } catch (...) {
    t->drop();
    throw;
  }
}

void CoroHub::arm_deadline(CoroTaskBase* t, std::int64_t at_ns) {
  t->hold();
  try {
    push(Entry{at_ns, Kind::deadline, t, 0, nullptr, 0});
  } catch (...) {
    t->drop();
    throw;
  }
}

void CoroHub::arm_poll(CoroTaskBase* t, std::uint64_t gen, TaskStateBase* awaited) {
  t->hold();
  awaited->add_ref();
  try {
    push(Entry{now_ns() + kPollFirstNs, Kind::poll, t, gen, awaited, kPollFirstNs});
  } catch (...) {
    awaited->release();
    t->drop();
    throw;
  }
}

void CoroHub::retry(CoroTaskBase* t, bool abandon) noexcept {
  t->hold();
  try {
    push(Entry{now_ns() + kRetryNs, abandon ? Kind::retry_abandon : Kind::retry, t, 0, nullptr, 0});
  } catch (...) {
    t->drop();
    t->abandon(Errc::shutdown_dropped);  // out of memory: end it here rather than leak it
  }
}

void CoroHub::timer_loop() noexcept {
  name_thread("crew", "coro-timer");
  // Started by whichever thread armed the first timer, often a worker: it
  // fires every worker's timers, so it runs as the process's main thread
  // does, not under that worker's policy, nice value or slice.
  adopt_main_thread_scheduling();
  t_timer_hub = this;
  // Wake-ups at the deadline, not up to the default 50 us after it.
  (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  std::unique_lock lock(timer_mu_);
  while (!timer_stop_) {
    if (heap_.empty()) {
      timer_wakes_at_ = std::numeric_limits<std::int64_t>::max();
      timer_cv_.wait(lock);
      timer_wakes_at_ = 0;
      continue;
    }
    const std::int64_t now = now_ns();
    const std::int64_t next = heap_.front().at_ns;
    // A worker that sleeps until it fires it: a backstop only.
    const bool watched = timer_watched(next);
    const std::int64_t at = watched ? saturating_add(next, kBackstopNs) : next;
    if (at > now) {
      if (watched || at - now > kSpinNs) {
        // Unwatched, until shortly before: a timed futex wait ends tens of
        // microseconds late on a busy machine.
        timer_wakes_at_ = watched ? at : at - kSpinNs;
        timer_cv_.wait_until(lock, Clock::time_point(Clock::duration(timer_wakes_at_)));
        timer_wakes_at_ = 0;
      } else {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      }
      continue;
    }
    // At most the reserved capacity (never a reallocation here): what is
    // left due is taken in the next round, at once.
    while (!heap_.empty() && heap_.front().at_ns <= now && due_.size() < due_.capacity()) {
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      due_.push_back(heap_.back());
      heap_.pop_back();
    }
    publish_next();
    lock.unlock();
    for (Entry& e : due_) fire(e);
    due_.clear();
    lock.lock();
  }
}

void CoroHub::fire(Entry& e) noexcept {
  CoroTaskBase* t = e.task;
  switch (e.kind) {
    case Kind::wake:
      (void)t->fire(e.gen, Wake::event);
      break;
    case Kind::deadline:
      if (!t->state().done()) (void)t->state().request_stop(StopReason::timed_out);
      break;
    case Kind::poll:
      if (e.awaited->done()) {
        (void)t->fire(e.gen, Wake::event);
      } else if (t->suspension().armed_gen() == e.gen) {
        e.backoff_ns = std::min(e.backoff_ns * 2, kPollMaxNs);
        e.at_ns = now_ns() + e.backoff_ns;
        try {
          push(e);  // tells the timer thread if it is now the earliest
          return;   // the references go with the entry
        } catch (...) {
          // Out of memory: resumed now, its get() waits for the task on
          // the worker instead.
          (void)t->fire(e.gen, Wake::event);
        }
      }
      break;
    case Kind::retry:
    case Kind::retry_abandon:
      t->post_step(e.kind == Kind::retry_abandon);
      break;
  }
  if (e.awaited != nullptr) e.awaited->release();
  t->drop();
}

std::vector<CoroTaskBase*> CoroHub::snapshot() {
  std::vector<CoroTaskBase*> out;
  for (;;) {
    const std::uint64_t ended = hand_offs_ended_.load(std::memory_order_seq_cst);
    out.reserve(live());
    for (Shard& sh : shards_) {
      SpinLockGuard lock(sh.mu);
      for (CoroTaskBase* t = sh.head; t != nullptr; t = t->reg_next) {
        out.push_back(t);  // capacity may run out: the spin lock is held briefly either way
        t->hold();
      }
    }
    // A task spawned from one of this pool's coroutine tasks is listed in
    // its parent's children, not in the shards: each generation in turn.
    for (std::size_t i = 0; i < out.size(); ++i) {
      CoroTaskBase* const parent = out[i];
      parent->for_each_child([&](CoroTaskBase& c) {
        if (&c.core() != &parent->core()) return;  // another pool's, in its own hub
        out.push_back(&c);
        c.hold();
      });
    }
    // A parent that ended meanwhile may have moved a child from its list
    // (not walked yet) to a shard (walked already): walk again. Rare: only
    // tasks that end before the tasks they spawned hand off.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (hand_offs_begun_.load(std::memory_order_seq_cst) == ended) return out;
    for (CoroTaskBase* t : out) t->drop();
    out.clear();
  }
}

bool CoroHub::wait_all(Clock::time_point deadline) {
  idle_waiters_.fetch_add(1, std::memory_order_acq_rel);
  struct Done {
    std::atomic<int>& n;
    ~Done() { n.fetch_sub(1, std::memory_order_relaxed); }
  } done{idle_waiters_};
  std::unique_lock lock(idle_mu_);
  const auto none = [this] { return none_live(); };
  if (deadline == Clock::time_point::max()) {
    idle_cv_.wait(lock, none);
    return true;
  }
  return idle_cv_.wait_until(lock, deadline, none);
}

bool CoroHub::shut_down(ShutdownMode mode, Clock::time_point deadline,
                        std::chrono::nanoseconds grace, ShutdownReport& report) noexcept {
  if (live() == 0) return false;
  closing_.store(true, std::memory_order_seq_cst);
  struct Reopen {
    CoroHub* hub;
    ~Reopen() { hub->closing_.store(false, std::memory_order_seq_cst); }
  } reopen{this};
  bool escalated = false;
  std::vector<CoroTaskBase*> tasks;
  struct Release {
    std::vector<CoroTaskBase*>& tasks;
    ~Release() {
      for (CoroTaskBase* t : tasks) t->drop();
    }
  } release{tasks};
  try {
    if (mode == ShutdownMode::drain) {
      if (wait_all(deadline)) return false;
      escalated = true;
    }
    // Stop them all: a task not started yet ends rejected unless a drain
    // let it start; the others are stopped and given the grace (a soft
    // shutdown: its timeout, if that is later). Parents before their
    // children: a child stopped (or dropped) first could end, wake a
    // parent not stopped yet and make it fail on the child's error, where
    // a stopped parent ends cancelled.
    tasks = snapshot();
    std::stable_sort(tasks.begin(), tasks.end(), [](const CoroTaskBase* a, const CoroTaskBase* b) {
      return a->spawn_depth() < b->spawn_depth();
    });
    // Which of them this shutdown stops: not those already stopped (by
    // their handle, group, deadline or parent) or ended before it began,
    // whose outcome their callers may have seen already. A child stopped
    // in the loop below through its parent's stop (reason `cancelled`) is
    // the shutdown's too, so the reason alone cannot tell.
    std::vector<bool> ours(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      const TaskStateBase& s = tasks[i]->state();
      ours[i] = !s.done() && s.stop_reason() == StopReason::none;
    }
    for (CoroTaskBase* t : tasks) {
      TaskStateBase& s = t->state();
      if (!escalated && s.claim_in_queue(TaskStatus::rejected, Errc::shutdown_dropped)) {
        // Counted by whoever consumes its StartCell.
        settle_in_queue(&s, false);
        report.rejected.push_back(TaskRef{s.id, s.name(), s.correlation_id()});
      } else {
        (void)s.request_stop(StopReason::shutdown);
      }
    }
    auto until = Clock::now() + grace;
    if (mode == ShutdownMode::soft && deadline != Clock::time_point::max()) {
      until = std::max(until, deadline);
    }
    if (!wait_all(until)) {
      // Past the grace: the frames still suspended are destroyed on the
      // pool's workers; a task running now keeps its frame until it
      // suspends again (the pool takes no more steps then, and the frame
      // is destroyed on that thread).
      for (CoroTaskBase* t : tasks) {
        if (t->state().done()) continue;
        if (t->claim_armed()) {
          report.abandoned.push_back(
              TaskRef{t->state().id, t->state().name(), t->state().correlation_id()});
          t->post_step(/*abandon=*/true);
        }
      }
      (void)wait_all(Clock::now() + grace);
    }
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      const TaskStateBase& s = tasks[i]->state();
      if (!ours[i]) continue;
      if (s.status() == TaskStatus::cancelled && s.reason() == Errc::cancelled) {
        report.cancelled.push_back(TaskRef{s.id, s.name(), s.correlation_id()});
      } else if (s.status() == TaskStatus::cancelled && s.reason() == Errc::shutdown_dropped) {
        report.rejected.push_back(
            TaskRef{s.id, s.name(), s.correlation_id()});  // its start never ran
      }
    }
  } catch (...) {
    // Out of memory for the lists: the counts still hold.
  }
  return escalated;
}

CoroutineTasks CoroHub::report() {
  CoroutineTasks out;
  const std::int64_t now = now_ns();
  std::vector<CoroTaskBase*> tasks = snapshot();
  for (CoroTaskBase* t : tasks) {
    const TaskStateBase& s = t->state();
    if (!s.done()) ++out.live;
    if (t->suspension().armed_gen() != 0) {
      out.suspended.push_back(SuspendedCoroutine{
          TaskRef{s.id, s.name(), s.correlation_id()}, to_string(t->suspension().waits_on()),
          std::chrono::nanoseconds(std::max<std::int64_t>(0, now - t->suspension().since_ns()))});
    }
  }
  for (CoroTaskBase* t : tasks) t->drop();
  return out;
}

}  // namespace crew::detail

namespace crew {

CoroutineTasks coroutine_tasks(const Pool& pool) {
  detail::SuspendedTasks* hub = detail::PoolAccess::core(pool).suspended();
  if (hub == nullptr) return {};  // no coroutine task was ever spawned
  return static_cast<detail::CoroHub*>(hub)->report();
}

}  // namespace crew

// Task states, handles' waiting and stopping, and the to_string functions of
// the task's enums.
#include "crew/task.hpp"

#include <thread>

#include "futex.hpp"
#include "pool_runtime.hpp"

namespace crew {

std::string_view to_string(TaskStatus s) noexcept {
  switch (s) {
    case TaskStatus::queued:
      return "queued";
    case TaskStatus::running:
      return "running";
    case TaskStatus::succeeded:
      return "succeeded";
    case TaskStatus::failed:
      return "failed";
    case TaskStatus::cancelled:
      return "cancelled";
    case TaskStatus::timed_out:
      return "timed_out";
    case TaskStatus::rejected:
      return "rejected";
    case TaskStatus::shed:
      return "shed";
  }
  return "unknown";
}

std::string_view to_string(CancelResult r) noexcept {
  switch (r) {
    case CancelResult::cancelled:
      return "cancelled";
    case CancelResult::stop_requested:
      return "stop_requested";
    case CancelResult::not_interruptible:
      return "not_interruptible";
    case CancelResult::already_finished:
      return "already_finished";
  }
  return "unknown";
}

namespace detail {

namespace {

// A task that ends without running waited in the queue until now.
void clock_unrun(TaskClock& clock) noexcept {
  if (clock.enqueued_ns() == 0) return;
  const std::int64_t now = now_ns();
  clock.record(now, now);
}

}  // namespace

void settle_in_queue(TaskStateBase* s, bool count) noexcept {
  clock_unrun(s->clock);
  s->discard_callable();
  if (s->owner != nullptr) s->owner->settled_in_queue(s, count);
  s->publish_settled();
}

bool TaskStateBase::expire() noexcept {
  if (!claim_in_queue(TaskStatus::rejected, Errc::expired)) return false;
  clock_unrun(clock);
  // Counted before the callable hears of it: a listener completes the task
  // elsewhere (crew::asio posts its completion handler).
  if (owner != nullptr) owner->settled_in_queue(this, /*count=*/true);
  queue_expired();
  discard_callable();
  publish_settled();
  return true;
}

bool TaskStateBase::shed(OverloadReason why) noexcept {
  if (!claim_in_queue(TaskStatus::shed, Errc::overloaded)) return false;
  clock_unrun(clock);
  set_overload_reason(why);
  if (owner != nullptr) owner->settled_in_queue(this, /*count=*/true);
  queue_shed(why);
  discard_callable();
  publish_settled();
  return true;
}

template <class Settled>
bool TaskWord::park_until(Settled settled,
                          std::chrono::steady_clock::time_point deadline) const noexcept {
  for (;;) {
    std::uint64_t cur = word_.load(std::memory_order_acquire);
    if (settled(static_cast<std::uint32_t>(cur))) return true;
    if ((cur & kWaitersBit) == 0 &&
        !word_.compare_exchange_weak(cur, cur | kWaitersBit, std::memory_order_acq_rel)) {
      continue;
    }
    if (deadline != std::chrono::steady_clock::time_point::max() &&
        std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    futex_wait_low(word_, static_cast<std::uint32_t>(cur | kWaitersBit), deadline);
  }
}

bool TaskWord::wait_until(std::chrono::steady_clock::time_point deadline) const noexcept {
  // A task that is about to finish costs less to wait for by polling than
  // by parking: a futex wait and the wake it needs are a few microseconds
  // each. Yield while polling, so that a worker sharing this core can run.
  for (int i = 0; i < kSpinPolls; ++i) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return park_until([](std::uint32_t w) { return is_final(status_of(w)); }, deadline);
}

bool TaskWord::wait_returned_until(std::chrono::steady_clock::time_point deadline) const noexcept {
  return park_until([](std::uint32_t w) { return is_final(status_of(w)) && (w & kLiveBit) == 0; },
                    deadline);
}

void TaskWord::wake(std::uint64_t prev) noexcept {
  if ((prev & kWaitersBit) != 0) futex_wake_low(word_, INT32_MAX);
}

StopRequest TaskStateBase::request_stop(StopReason why) noexcept {
  std::stop_source src;
  bool signalled = false;
  stop_mu_.lock();
  if (extras_ != nullptr && extras_->run_over) {
    stop_mu_.unlock();
    return StopRequest::too_late;
  }
  note_stop_reason(why);
  RunFrame* const runner = extras_ != nullptr ? extras_->runner : nullptr;
  if (runner != nullptr) {
    // The runner replaces a poisoned source before its next task.
    runner->poisoned = true;
    std::int64_t unset = 0;
    runner->stop_at_ns.compare_exchange_strong(unset, now_ns(), std::memory_order_acq_rel);
    src = runner->source;
    signalled = true;
    // While the runner is attached its thread is inside the task, so its
    // pool is alive; the wake must happen before the lock is released.
    if (runner->core != nullptr) runner->core->runtime().supervisor.wake();
  }
  stop_mu_.unlock();
  // Outside the lock: stop callbacks are user code.
  if (signalled) src.request_stop();
  stop_requested_hook();
  return signalled ? StopRequest::signalled : StopRequest::recorded;
}

void TaskStateBase::attach_runner(RunFrame* frame) noexcept {
  CREW_ASSERT(extras_ != nullptr, "a long task without Extras");
  stop_mu_.lock();
  extras_->runner = frame;
  // A stop requested between leaving the queue and attaching.
  const bool stop_now = stop_reason_.load(std::memory_order_acquire) != StopReason::none;
  if (stop_now) {
    frame->poisoned = true;
    frame->stop_at_ns.store(now_ns(), std::memory_order_release);
  }
  stop_mu_.unlock();
  if (stop_now) {
    frame->source.request_stop();
    if (frame->core != nullptr) frame->core->runtime().supervisor.wake();
  }
}

StopReason TaskStateBase::detach_runner() noexcept {
  stop_mu_.lock();
  extras_->runner = nullptr;
  extras_->run_over = true;
  const StopReason why = stop_reason_.load(std::memory_order_acquire);
  stop_mu_.unlock();
  return why;
}

}  // namespace detail
}  // namespace crew

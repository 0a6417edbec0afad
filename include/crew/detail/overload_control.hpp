// crew/detail/overload_control.hpp: detail::OverloadControl, a pool's
// overload controller (crew/overload.hpp says what it does). PoolCore holds
// one only when PoolOptions::overload.enabled; the inline parts here are
// what the submission path calls, the rest is in src/engine/overload_control.cpp.
//
// Who touches what:
//   submitters: admit() (the admitted count, the limit, the refusal counters)
//   whoever pops an admitted cell: release()
//   a thread starting an admitted task: on_start() records its queue wait in
//     the window (relaxed atomics); the one that finds the interval over
//     sums it up under roll_ (try-lock: the others go on) and publishes the
//     limit and the overloaded state
//   readers (stats, crewd's I/O threads): read(), would_refuse()
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "crew/overload.hpp"

namespace crew::detail {

class OverloadControl {
 public:
  // `floor` and `ceiling` bound the limit (the caller resolved the
  // defaults); `workers` is the pool's max_workers (the backlog estimate
  // takes that many admitted tasks as running).
  OverloadControl(const OverloadOptions& o, std::size_t floor, std::size_t ceiling,
                  std::size_t workers, std::int64_t now) noexcept;
  OverloadControl(const OverloadControl&) = delete;
  OverloadControl& operator=(const OverloadControl&) = delete;

  // Takes one admission ticket, or says why not (nothing taken then).
  // `queue_timeout_ns`: the task's queue timeout, 0 for none.
  OverloadReason admit(std::int64_t queue_timeout_ns) noexcept {
    const std::int64_t n = admitted_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n > peak_.load(std::memory_order_relaxed)) peak_.store(n, std::memory_order_relaxed);
    const std::int64_t limit = limit_.load(std::memory_order_relaxed);
    if (n >= limit) [[unlikely]] {
      if (!limit_hit_.load(std::memory_order_relaxed))
        limit_hit_.store(true, std::memory_order_relaxed);
      if (n > limit) {
        admitted_.fetch_sub(1, std::memory_order_relaxed);
        refused_limit_.fetch_add(1, std::memory_order_relaxed);
        return OverloadReason::limit;
      }
    }
    if (queue_timeout_ns != 0 && deadline_admission_ && backlog_wait_ns(n - 1) > queue_timeout_ns)
        [[unlikely]] {
      admitted_.fetch_sub(1, std::memory_order_relaxed);
      refused_deadline_.fetch_add(1, std::memory_order_relaxed);
      return OverloadReason::deadline;
    }
    return OverloadReason::none;
  }
  // Returns a ticket: its task ended, or its cell was dropped.
  void release() noexcept { admitted_.fetch_sub(1, std::memory_order_relaxed); }

  // An admitted task about to start at `now` after waiting `wait_ns` since
  // admission. True: shed it (CoDel) instead of running it; the caller
  // calls note_shed() once it did.
  bool on_start(std::int64_t wait_ns, std::int64_t now) noexcept {
    record(wait_ns, now);
    if (now >= window_end_.load(std::memory_order_relaxed)) [[unlikely]]
      roll(now);
    return wait_ns > shed_after_ns_ && overloaded_.load(std::memory_order_relaxed);
  }
  void note_shed() noexcept { shed_codel_.fetch_add(1, std::memory_order_relaxed); }
  // A caller acted on hint() and refused a submission itself.
  void note_refused_early() noexcept { refused_limit_.fetch_add(1, std::memory_order_relaxed); }

  // What admit() would say now, without taking a ticket (a cheap early
  // answer, such as crewd's from a request's head), and the queue wait a
  // task admitted now would see.
  [[nodiscard]] OverloadHint hint() const noexcept {
    const std::int64_t n = admitted_.load(std::memory_order_relaxed);
    OverloadHint h;
    if (n >= limit_.load(std::memory_order_relaxed)) h.reason = OverloadReason::limit;
    h.wait_estimate = std::chrono::nanoseconds(
        std::max(last_high_.load(std::memory_order_relaxed), backlog_wait_ns(n)));
    return h;
  }

  [[nodiscard]] OverloadStats read() const noexcept;

  // The bucket of a queue wait in the window's histogram: four per power
  // of two of microseconds (about 19 % apart), and its upper bound.
  static constexpr std::size_t kBuckets = 96;
  [[nodiscard]] static std::size_t bucket_of(std::int64_t wait_ns) noexcept;
  [[nodiscard]] static std::int64_t bucket_upper_ns(std::size_t bucket) noexcept;

  // Sums up the window ending at `now` (also called by tests with a
  // controlled clock). Does nothing if another thread is at it.
  void roll(std::int64_t now) noexcept;
  // Records one queue wait, of a task started at `now`, in the current window.
  void record(std::int64_t wait_ns, std::int64_t now) noexcept {
    hist_[bucket_of(wait_ns)].fetch_add(1, std::memory_order_relaxed);
    if (win_first_.load(std::memory_order_relaxed) == 0) {
      std::int64_t none = 0;
      win_first_.compare_exchange_strong(none, now, std::memory_order_relaxed);
    }
    std::int64_t m = win_min_.load(std::memory_order_relaxed);
    while (wait_ns < m && !win_min_.compare_exchange_weak(m, wait_ns, std::memory_order_relaxed)) {
    }
  }

 private:
  void roll_locked(std::int64_t now) noexcept CREW_REQUIRES(roll_);
  // The wait of a task admitted behind `ahead` others: those beyond the
  // workers, at the last interval's start rate (0 while none is known).
  [[nodiscard]] std::int64_t backlog_wait_ns(std::int64_t ahead) const noexcept {
    const std::int64_t per_start = ns_per_start_.load(std::memory_order_relaxed);
    const std::int64_t queued = ahead - workers_;
    return queued > 0 && per_start > 0 ? queued * per_start : 0;
  }

  // Read-mostly: the submitters' and starters' view.
  const std::int64_t target_ns_;
  const std::int64_t shed_after_ns_;  // 2 x target
  const std::int64_t interval_ns_;
  const double percentile_;
  const bool adaptive_;
  const bool deadline_admission_;
  const std::int64_t workers_;
  const double floor_;
  const double ceiling_;
  std::atomic<std::int64_t> limit_;
  std::atomic<std::int64_t> window_end_;
  std::atomic<bool> overloaded_{false};
  std::atomic<std::int64_t> ns_per_start_{0};  // 0: no start in the last interval

  // Written by every submission and every end.
  alignas(kCacheLine) std::atomic<std::int64_t> admitted_{0};
  std::atomic<bool> limit_hit_{false};  // the limit was reached this interval
  std::atomic<std::int64_t> peak_{0};   // the most admitted at once this interval

  // The window: written by every start.
  alignas(kCacheLine) std::atomic<std::int64_t> win_min_;
  std::atomic<std::int64_t> win_first_{0};  // when its first task started (0: none yet)
  std::array<std::atomic<std::uint32_t>, kBuckets> hist_{};

  // Summed up by roll() under roll_.
  alignas(kCacheLine) SpinLock roll_;
  double limit_exact_ CREW_GUARDED_BY(roll_);
  std::int64_t window_start_ CREW_GUARDED_BY(roll_);
  std::atomic<std::int64_t> last_min_{0};
  std::atomic<std::int64_t> last_high_{0};

  std::atomic<std::uint64_t> refused_limit_{0};
  std::atomic<std::uint64_t> refused_deadline_{0};
  std::atomic<std::uint64_t> shed_codel_{0};
};

// Returns an admission ticket when it leaves scope (none for null): for the
// thread that popped an admitted task state and is done with it.
class TicketReturn {
 public:
  explicit TicketReturn(OverloadControl* ctl) noexcept : ctl_(ctl) {}
  ~TicketReturn() {
    if (ctl_ != nullptr) ctl_->release();
  }
  TicketReturn(const TicketReturn&) = delete;
  TicketReturn& operator=(const TicketReturn&) = delete;
  [[nodiscard]] bool held() const noexcept { return ctl_ != nullptr; }

 private:
  OverloadControl* ctl_;
};

}  // namespace crew::detail

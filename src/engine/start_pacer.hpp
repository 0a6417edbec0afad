// StartPacer: PoolOptions::max_start_rate, a token bucket on task starts
// (GCRA: one atomic "theoretical arrival time"), and the rule that at most
// one worker waits for the next token while the others sleep as idle
// workers do. A worker takes a token before it pops a task, so no worker
// ever holds a popped task while it waits.
//
// Who touches what: every worker about to pop calls try_take (and
// give_back when the pop found nothing); a worker that found no token and
// work queued tries begin_wait, and the one that gets it waits for the
// token outside the idle stack, then end_wait; sleeping workers read
// someone_waits (queued work is then not a reason to wake up).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace crew::detail {

class StartPacer {
 public:
  // `rate` starts per second (> 0), `burst` starts at once at most (>= 1).
  StartPacer(double rate, std::size_t burst, std::int64_t now) noexcept
      : period_ns_(std::max<std::int64_t>(static_cast<std::int64_t>(1e9 / rate), 1)),
        tolerance_ns_(static_cast<std::int64_t>(burst - 1) * period_ns_),
        tat_(now) {}
  StartPacer(const StartPacer&) = delete;
  StartPacer& operator=(const StartPacer&) = delete;

  // Takes the token for one start at `now`. False: none yet, and
  // `wait_ns` says how long until the next.
  bool try_take(std::int64_t now, std::int64_t& wait_ns) noexcept {
    std::int64_t tat = tat_.load(std::memory_order_relaxed);
    for (;;) {
      const std::int64_t allowed = tat - tolerance_ns_;
      if (now < allowed) {
        wait_ns = allowed - now;
        return false;
      }
      if (tat_.compare_exchange_weak(tat, std::max(tat, now) + period_ns_,
                                     std::memory_order_relaxed)) {
        return true;
      }
    }
  }
  // Returns a token taken for a pop that found nothing.
  void give_back() noexcept { tat_.fetch_sub(period_ns_, std::memory_order_relaxed); }

  // True for the one worker that may wait for the next token.
  bool begin_wait() noexcept { return !waiter_.exchange(true, std::memory_order_acq_rel); }
  void end_wait() noexcept { waiter_.store(false, std::memory_order_release); }
  [[nodiscard]] bool someone_waits() const noexcept {
    return waiter_.load(std::memory_order_acquire);
  }

 private:
  const std::int64_t period_ns_;
  const std::int64_t tolerance_ns_;
  std::atomic<std::int64_t> tat_;
  std::atomic<bool> waiter_{false};
};

}  // namespace crew::detail

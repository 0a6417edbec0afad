// The contended half of crew::detail::SpinLock (crew/detail/spin_lock.hpp).
#include "crew/detail/spin_lock.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace crew::detail {

void SpinLock::lock_contended() noexcept {
  // A holder running on another CPU ends a section of a few instructions
  // within a few dozen looks, made without a pause as this lock always
  // has. A holder that lost its CPU does not end it:
  // yield, which lets a holder of the same scheduling on this CPU run; and
  // since a real-time waiter's yield lets no normal holder run, nap after
  // that, longer while the lock stays held, so that a waiter behind a long
  // section wakes rarely.
  static constexpr int kLooks = 64;
  static constexpr int kYields = 16;
  static constexpr std::chrono::microseconds kFirstNap{20};
  static constexpr std::chrono::microseconds kLongestNap{1000};
  std::chrono::microseconds nap = kFirstNap;
  for (int tries = 0;; ++tries) {
    if (word_.load(std::memory_order_relaxed) == kFree &&
        word_.exchange(kHeld, std::memory_order_acquire) == kFree) {
      return;
    }
    if (tries < kLooks) continue;
    if (tries < kLooks + kYields) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, kLongestNap);
  }
}

}  // namespace crew::detail

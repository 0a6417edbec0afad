// The waiting half of crew::detail::SpinLock (crew/detail/spin_lock.hpp).
#include "crew/detail/spin_lock.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace crew::detail {

int SpinLock::back_off(int waits) noexcept {
  // A holder running on another CPU ends a section of a few instructions
  // within the first looks. One that lost its CPU does not: a yield lets a
  // holder of the same scheduling on this CPU run; a real-time waiter's
  // yield lets no normal holder run, so after a few the waiter naps, longer
  // while the lock stays held (20, 40, ... us, at most 1 ms), so that a
  // waiter behind a long section wakes rarely.
  static constexpr int kYields = 16;
  static constexpr int kDoublings = 6;  // 20 us * 2^6 > 1 ms
  static constexpr std::chrono::microseconds kFirstNap{20};
  static constexpr std::chrono::microseconds kLongestNap{1000};
  if (waits < kYields) {
    sched_yield();
    return waits + 1;
  }
  const int doublings = waits - kYields;
  std::this_thread::sleep_for(std::min(kFirstNap * (1 << doublings), kLongestNap));
  return std::min(waits + 1, kYields + kDoublings);
}

}  // namespace crew::detail

// crew/detail/deadline.hpp: "now + timeout" without overflow.
//
// Timeouts come from users (Task::wait_for(nanoseconds::max()), task_timeout
// near the maximum), so adding one to a clock reading may overflow the
// 64-bit count, which is undefined behaviour. Every deadline crew computes
// goes through these: a sum past the end of the clock's range is the end of
// the range (kNoDeadline, "never"), one before its start is its start.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <ratio>
#include <type_traits>

namespace crew::detail {

// a + b, clamped to the range of int64.
[[nodiscard]] constexpr std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    return b > 0 ? std::numeric_limits<std::int64_t>::max()
                 : std::numeric_limits<std::int64_t>::min();
  }
  return sum;
}

// Any duration as nanoseconds, clamped to nanoseconds' range (hours::max()
// does not fit). Compared in floating point, where nothing overflows.
template <class Rep, class Period>
[[nodiscard]] constexpr std::chrono::nanoseconds saturating_ns(
    std::chrono::duration<Rep, Period> d) noexcept {
  using std::chrono::nanoseconds;
  using Wide = std::chrono::duration<long double, std::nano>;
  const Wide wide = std::chrono::duration_cast<Wide>(d);
  if (wide >= Wide(static_cast<long double>(nanoseconds::max().count()))) {
    return nanoseconds::max();
  }
  if (wide <= Wide(static_cast<long double>(nanoseconds::min().count()))) {
    return nanoseconds::min();
  }
  return std::chrono::duration_cast<nanoseconds>(d);
}

// now + d on steady_clock; time_point::max() (no deadline) when it does not fit.
template <class Rep, class Period>
[[nodiscard]] std::chrono::steady_clock::time_point saturating_deadline(
    std::chrono::steady_clock::time_point now, std::chrono::duration<Rep, Period> d) noexcept {
  using Clock = std::chrono::steady_clock;
  static_assert(std::is_same_v<Clock::duration, std::chrono::nanoseconds>,
                "crew assumes a nanosecond steady_clock");
  return Clock::time_point(
      Clock::duration(saturating_add(now.time_since_epoch().count(), saturating_ns(d).count())));
}

}  // namespace crew::detail

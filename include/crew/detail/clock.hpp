// crew's clock: steady_clock nanoseconds, read from the CPU's time-stamp
// counter where that is cheaper.
//
// A pool reads the clock two or three times per task when it times tasks
// (observers, long tasks): at enqueue, start and end. On machines where the
// kernel keeps time with the TSC, steady_clock::now() still costs a vDSO
// call (about 20-35 ns, more in VMs) where rdtsc costs about 10.
//
// now_ns() extrapolates from an anchor, a (tsc, steady ns) pair taken from
// both clocks, with a ns-per-tick rate measured between the first anchor
// and the latest. An anchor is valid for kSpanTicks; the first read past it
// takes a new one from steady_clock (and refines the rate over the longer
// baseline). Anchors are taken only from pairs read within ~0.3 us of each
// other, so a preempted thread cannot skew one. The clock never strays from
// steady_clock by more than the rate error over one span: under a
// microsecond once calibrated (reads during the first 10 ms come from
// steady_clock), then nanoseconds. Readers never take a lock: the anchor is
// a seqlock, and a read that races a new anchor falls back to steady_clock.
//
// The TSC is used only when the kernel uses it as its clock source (it then
// vouches that the counter is invariant and synchronized across CPUs) and
// rdtsc measured cheaper than steady_clock at start; otherwise, and on
// other architectures, now_ns() is steady_clock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>

// The time-stamp counter is read with the compiler's builtin (GCC and
// clang), not <x86intrin.h>: that header is some 48,000 preprocessed lines,
// which every file including crew/pool.hpp would pay for.
#if defined(__x86_64__) || defined(__i386__)
#define CREW_HAVE_TSC 1
#else
#define CREW_HAVE_TSC 0
#endif

namespace crew::detail {

inline std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class TscClock {
 public:
  // Ticks an anchor stays valid: ~20 ms at 3 GHz, and small enough that
  // ticks * rate fits in 64 bits with the rate in 32.32 fixed point.
  static constexpr std::uint64_t kSpanTicks = std::uint64_t{1} << 26;

  static std::int64_t now_ns() noexcept {
#if CREW_HAVE_TSC
    const std::uint32_t seq = seq_.load(std::memory_order_acquire);
    if ((seq & 1) == 0 && seq != 0) [[likely]] {
      const std::uint64_t tsc = __builtin_ia32_rdtsc();
      // Acquire loads pair with the writer's release stores, so the seq
      // read after them sees any anchor write they saw part of (no fences:
      // ThreadSanitizer does not model them; on x86 these are plain loads).
      const std::uint64_t base_tsc = base_tsc_.load(std::memory_order_acquire);
      const std::int64_t base_ns = base_ns_.load(std::memory_order_acquire);
      const std::uint64_t rate = rate_.load(std::memory_order_acquire);
      const std::uint64_t ticks = tsc - base_tsc;  // huge if tsc < base_tsc
      if (seq_.load(std::memory_order_relaxed) == seq && ticks < kSpanTicks) [[likely]] {
        return base_ns + static_cast<std::int64_t>((ticks * rate) >> 32);
      }
    }
    return slow_now_ns();
#else
    return steady_ns();
#endif
  }

  // True once reads come from the TSC (tests and the benchmark report).
  static bool uses_tsc() noexcept;

  // In a child of fork() (an atfork handler in clock.cpp): an anchor another
  // thread was writing at the fork (seq_ odd) is never finished there, so
  // calibration starts again.
  static void reset_in_child() noexcept;

 private:
  // Reads steady_clock, and calibrates or re-anchors when it is due.
  static std::int64_t slow_now_ns() noexcept;

  // seq_: 0 = not calibrated (or the TSC is not used), odd = an anchor is
  // being written, even = valid.
  static inline std::atomic<std::uint32_t> seq_{0};
  static inline std::atomic<std::uint64_t> base_tsc_{0};
  static inline std::atomic<std::int64_t> base_ns_{0};
  static inline std::atomic<std::uint64_t> rate_{0};  // ns per tick, 32.32 fixed point
};

// steady_clock nanoseconds; 0 means "none" wherever a time is optional.
inline std::int64_t now_ns() noexcept { return TscClock::now_ns(); }

// steady_clock nanoseconds as of the kernel's last clock tick (Linux
// CLOCK_MONOTONIC_COARSE): up to one tick (1-10 ms) early, never late, and
// read without the time-stamp counter (about 4 ns against now_ns()'s 11-25
// on the development VM). For stamps only reported, never compared with a
// deadline: since when a coroutine task is suspended (a stamp taken at every
// suspension). Elsewhere now_ns().
inline std::int64_t coarse_now_ns() noexcept {
#if defined(CLOCK_MONOTONIC_COARSE)
  timespec t{};
  (void)clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + std::int64_t{t.tv_nsec};
#else
  return now_ns();
#endif
}

// A cheap count for short intervals compared across threads (the wake-up
// policy's heartbeat, crew/detail/idle_counts.hpp): the time-stamp counter
// on x86, whatever clock source the kernel uses, else now_ns(). Not a time:
// convert with cycles_per_us(). Counters of two CPUs may disagree by a
// little; compare differences as signed numbers.
inline std::uint64_t cycles() noexcept {
#if CREW_HAVE_TSC
  return __builtin_ia32_rdtsc();
#else
  return static_cast<std::uint64_t>(now_ns());
#endif
}

// cycles() per microsecond, measured against steady_clock over about 50 us
// on the first call (which then busy-waits that long); at least 1.
std::uint64_t cycles_per_us() noexcept;

}  // namespace crew::detail

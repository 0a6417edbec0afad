// The slow path of crew's clock (crew/detail/clock.hpp): calibration and
// new anchors.
#include "crew/detail/clock.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace crew::detail {

#if CREW_HAVE_TSC
namespace {

enum Phase : int { kUnknown, kCalibrating, kRunning, kSteadyOnly };

// Written only by the thread holding the anchor (seq_ odd); phase is also
// read by uses_tsc().
std::atomic<int> g_phase{kUnknown};
std::uint64_t g_first_tsc = 0;
std::int64_t g_first_ns = 0;

// The first anchor's rate is measured over at least this long.
constexpr std::int64_t kCalibrationNs = 10'000'000;

// A (tsc, ns) pair is taken as tsc, steady_clock, tsc; it is used only if
// the two TSC reads are this close (a steady_clock read takes ~100 ticks),
// so that a thread preempted or interrupted in between cannot skew an
// anchor or the rate.
constexpr std::uint64_t kPairTicks = 1000;

bool read_pair(std::uint64_t& tsc, std::int64_t& ns) noexcept {
  const std::uint64_t t1 = __builtin_ia32_rdtsc();
  ns = steady_ns();
  const std::uint64_t t2 = __builtin_ia32_rdtsc();
  tsc = t1 + (t2 - t1) / 2;
  return t2 - t1 < kPairTicks;
}

// Whether the kernel keeps time with the TSC, rdtsc is cheaper than
// steady_clock here, and CREW_CLOCK=steady does not turn it off.
bool tsc_is_worth_it() {
  if (const char* env = std::getenv("CREW_CLOCK"); env != nullptr && std::string(env) == "steady") {
    return false;
  }
  std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  if (!(in >> source) || source != "tsc") return false;
  // The best of a few rounds of each: one preemption inside a round (a
  // busy machine) would otherwise decide for the whole process, and a
  // steady_clock read costs about twice what rdtsc does.
  constexpr int kReads = 256;
  constexpr int kRounds = 5;
  std::int64_t sink = 0;
  std::uint64_t steady = ~std::uint64_t{0};
  std::uint64_t tsc = ~std::uint64_t{0};
  for (int r = 0; r < kRounds; ++r) {
    const std::uint64_t t0 = __builtin_ia32_rdtsc();
    for (int i = 0; i < kReads; ++i) sink += steady_ns();
    const std::uint64_t t1 = __builtin_ia32_rdtsc();
    for (int i = 0; i < kReads; ++i) sink += static_cast<std::int64_t>(__builtin_ia32_rdtsc() & 1);
    const std::uint64_t t2 = __builtin_ia32_rdtsc();
    steady = std::min(steady, t1 - t0);
    tsc = std::min(tsc, t2 - t1);
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  (void)sink;
  // rdtsc must cost at most two thirds of a steady_clock read.
  return 3 * tsc <= 2 * steady;
}

// ns per tick in 32.32 fixed point, from the first anchor to (tsc, ns).
std::uint64_t rate_since_first(std::uint64_t tsc, std::int64_t ns) {
  const std::uint64_t ticks = tsc - g_first_tsc;
  const auto nanos = static_cast<std::uint64_t>(ns - g_first_ns);
  if (ticks == 0) return 0;
  // long double keeps 64 bits of mantissa: exact enough, and no __int128.
  return static_cast<std::uint64_t>(static_cast<long double>(nanos) * 4294967296.0L /
                                    static_cast<long double>(ticks));
}

}  // namespace

std::int64_t TscClock::slow_now_ns() noexcept {
  if (g_phase.load(std::memory_order_relaxed) == kSteadyOnly) return steady_ns();
  std::uint64_t tsc = 0;
  std::int64_t ns = 0;
  const bool exact = read_pair(tsc, ns);
  std::uint32_t seq = seq_.load(std::memory_order_relaxed);
  if (!exact || (seq & 1) != 0 ||
      !seq_.compare_exchange_strong(seq, seq | 1, std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
    return ns;  // a skewed pair, or another thread is writing the anchor
  }
  std::uint32_t next = seq;  // stays 0 until calibrated
  switch (g_phase.load(std::memory_order_relaxed)) {
    case kUnknown: {
      bool worth_it = false;
      try {
        worth_it = tsc_is_worth_it();
      } catch (...) {  // reading /sys failed: keep steady_clock
      }
      if (worth_it) {
        g_first_tsc = tsc;
        g_first_ns = ns;
      }
      g_phase.store(worth_it ? kCalibrating : kSteadyOnly, std::memory_order_relaxed);
      break;
    }
    case kCalibrating:
      if (ns - g_first_ns < kCalibrationNs || tsc <= g_first_tsc) break;
      g_phase.store(kRunning, std::memory_order_relaxed);
      [[fallthrough]];
    case kRunning:
      if (tsc <= g_first_tsc) break;  // keep the current anchor
      // Release stores, after the CAS that made seq odd: a reader that
      // acquire-loads one of them then sees seq odd or newer and retries.
      rate_.store(rate_since_first(tsc, ns), std::memory_order_release);
      base_tsc_.store(tsc, std::memory_order_release);
      base_ns_.store(ns, std::memory_order_release);
      next = seq + 2 == 0 ? 2 : seq + 2;
      break;
    default:
      break;
  }
  seq_.store(next, std::memory_order_release);
  return ns;
}

void TscClock::reset_in_child() noexcept {
  if ((seq_.load(std::memory_order_relaxed) & 1) == 0) return;
  g_phase.store(kUnknown, std::memory_order_relaxed);
  seq_.store(0, std::memory_order_release);
}

namespace {
// A writer of the anchor holds seq_ odd for a few instructions; a child of
// fork() that inherited it odd would take the slow path on every read.
void clock_in_child() noexcept { TscClock::reset_in_child(); }
[[maybe_unused]] const int g_clock_fork_handler = pthread_atfork(nullptr, nullptr, clock_in_child);
}  // namespace

bool TscClock::uses_tsc() noexcept {
  return g_phase.load(std::memory_order_relaxed) == kRunning &&
         seq_.load(std::memory_order_relaxed) != 0;
}

#else

std::int64_t TscClock::slow_now_ns() noexcept { return steady_ns(); }
void TscClock::reset_in_child() noexcept {}  // no anchor is ever written here

bool TscClock::uses_tsc() noexcept { return false; }

#endif

std::uint64_t cycles_per_us() noexcept {
  // Both counts go on while the thread is preempted, so a preemption in
  // the window does not skew the ratio; only the reads at its ends must be
  // close together, and 50 us makes their jitter (~0.1 us) small.
  static const std::uint64_t rate = [] {
    constexpr std::int64_t kWindowNs = 50'000;
    const std::uint64_t c0 = cycles();
    const std::int64_t t0 = steady_ns();
    std::int64_t t1 = t0;
    while (t1 - t0 < kWindowNs) t1 = steady_ns();
    const std::uint64_t c1 = cycles();
    const auto us = static_cast<std::uint64_t>(t1 - t0) / 1000;
    return std::max<std::uint64_t>(1, (c1 - c0) / std::max<std::uint64_t>(1, us));
  }();
  return rate;
}

}  // namespace crew::detail

// src/engine/wake_policy.hpp (private): the constants of the wake-up
// policy (src/engine/wake.cpp; docs/design/wake-ups.md): how long a spinner
// spins, when it yields its CPU, when help for a backlog is deferred. The
// engine's alone, so that tuning them rebuilds only the engine.
#pragma once

#include <cstddef>
#include <cstdint>

namespace crew::detail {

// A gap this long between two looks of a spinner (normally a few
// microseconds apart) means it did not have its CPU.
inline constexpr std::int64_t kLostCpuNs = 20'000;
// A spin's window while the machine's CPUs are contended: about what a
// wake-up costs (a futex wake-up took 5 us at the median on the 2-CPU
// VM), so that a spin that fails costs no more than the wake-up it tried
// to save. Long enough for a producer that is keeping a queue filled
// (crew_bench's short_detached and factorial: without any spin while
// contended 20 to 30 % slower than with the full window), short enough
// not to wait out the gap between two requests (crewd at wrk -c8: the
// compute workers' CPU per request 4.9 us against 4.0 without a spin and
// 14 with the full 50 us).
inline constexpr std::int64_t kContendedSpinNs = 5'000;
// A spinner that sees work it cannot take this many looks in a row (about
// 4 us) yields its CPU (wake.cpp, spin_for_work).
inline constexpr unsigned kStuckLooks = 16;
// A spinner that has kept its CPU this long (tasks and spins, no sleep)
// yields it when it sees nothing queued, to a thread that may be waiting
// for that CPU behind it.
inline constexpr std::int64_t kSpinYieldNs = 200'000;
// Deferred wake-ups (wake.cpp, wake_due): a backlog shorter than kBurst tasks
// gets help once it has lasted kBacklogNs; sleepers look at the queue every
// kWatchNs while another worker is awake.
inline constexpr std::size_t kBurst = 4;
inline constexpr std::int64_t kBacklogNs = 20'000;
inline constexpr std::int64_t kWatchNs = 4'000'000;
inline constexpr int kWatchLooks = 4;

// The process-wide spinning slots (wake.cpp): at most half the usable CPUs'
// worth of workers, across all pools, spin at once. A worker takes one
// before it spins and gives it back after; a child of fork() starts with
// every slot free. Any thread.
bool take_spinner_slot() noexcept;
void give_back_spinner_slot() noexcept;
int spinner_slots_taken() noexcept;

}  // namespace crew::detail

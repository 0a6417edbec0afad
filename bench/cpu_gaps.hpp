// bench/cpu_gaps.hpp: how often the machine takes each CPU away from a
// thread that never blocks, and for how long. Read beside the latency
// workload: a task that arrives while its worker's CPU is away waits for it
// (or for a wake-up elsewhere), whatever the pool, so these gaps bound the
// tail a pool can show on this machine.
#pragma once

#include <cstddef>
#include <vector>

namespace bench {

struct CpuGaps {
  std::size_t cpus = 0;     // CPUs measured (those the process may run on)
  double seconds = 0;       // per measurement
  double per_ms = 0;        // gaps of more than kMinGapNs, per CPU and ms
  double away_percent = 0;  // time in such gaps, per CPU
  double p50_us = 0;        // gap length, median over all CPUs' gaps
  double p99_us = 0;
  double max_us = 0;
};

// One thread pinned to each allowed CPU reads the clock in a loop for
// `seconds`; a step of more than kMinGapNs between two reads is a gap (the
// thread did not run: an interrupt, another thread, or the hypervisor).
inline constexpr long long kMinGapNs = 2'000;
CpuGaps measure_cpu_gaps(double seconds);

// Medians of per_ms, away_percent and p50_us, the largest p99_us and max_us.
CpuGaps median_of(const std::vector<CpuGaps>& runs);

// The round trip of a cache line between the first two allowed CPUs, in ns
// (two threads pinned one to each, passing a counter back and forth
// kCrossCoreTrips times; a few ms), or 0 with fewer than two CPUs. A
// virtual machine may place its CPUs close together (a shared cache) or far
// apart and move between the two; every task a pool hands from one thread
// to another pays this, so it says which of the two a measurement ran in.
inline constexpr int kCrossCoreTrips = 20'000;
double cross_core_round_trip_ns();

}  // namespace bench

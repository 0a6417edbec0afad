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

}  // namespace bench

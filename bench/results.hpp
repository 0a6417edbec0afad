// bench/results.hpp: what crew_bench's rounds sum up to, and its output:
// per (implementation, workload) pair a Summary, per latency rate a
// LatencySummary, the extras measured once (idle CPU, queued memory, the
// max-rate search, ...), and the table and JSON written from them
// (bench/results_output.cpp; bench/report.py reads the JSON).
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu_gaps.hpp"
#include "crew_extras.hpp"
#include "forkjoin.hpp"
#include "harness.hpp"
#include "options.hpp"

namespace bench {

inline constexpr double kSearchSeconds = 1;      // per trial of the max-rate search
inline constexpr double kGapSeconds = 0.5;       // the machine's CPU gaps, before each round
inline constexpr double kSustained = 0.95;       // achieved / target
inline constexpr double kSearchStart = 100'000;  // tasks/s, doubled until it fails
inline constexpr double kSearchCap = 8'000'000;

// The latency workload's name in --workload.
inline constexpr std::string_view kLatency = "latency";

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

struct RateSearch {
  double max_rate = 0;                            // 0: not even kSearchStart
  std::vector<std::pair<double, double>> trials;  // target, achieved
};

struct Summary {
  std::string impl;
  Workload workload{};
  std::vector<double> ns;  // per round; NaN for a failed run
  double ns_median = 0, ns_min = 0, ns_max = 0, allocs_median = 0;
  std::vector<double> crew_ratios;          // per round both ran: crew ns / this ns
  std::vector<double> ratio_cross_core_ns;  // the cross-core round trip of those rounds
  std::optional<double> crew_ratio_median;
  std::vector<double> cross_core_ns;  // per round (Sample::cross_core_ns)
  std::size_t executing_threads = 0;
  std::string alloc_note;
  std::size_t failed = 0;       // rounds without a figure
  std::string failure;          // their reasons
  std::optional<Sample> stack;  // the stack-tracking run (fork-join)
  [[nodiscard]] bool measured() const { return failed < ns.size(); }
};

struct LatencySummary {
  std::string impl;
  std::size_t threads = kWorkers;  // that ran the tasks
  double rate = 0;
  LatencySample median;  // field by field over rounds
  std::vector<double> sched_p99_rounds;
  std::vector<double> crew_sched_p99_ratios;  // crew's / this, per round
  std::optional<double> crew_sched_p99_ratio_median;
};

struct Extras {
  std::optional<RateSearch> rate_search;
  // The machine's CPU gaps, measured before each round's latency runs.
  std::vector<CpuGaps> gaps;
  std::vector<IdleCpu> idle;
  std::optional<QueuedMemory> queued;
  std::optional<PostAllocs> post;
  std::optional<ShutdownLatency> shutdown;
  std::optional<MetricsScrape> scrape;
};

struct Skip {
  std::string impl;
  Workload workload{};
  std::string reason;
};

// A workload as the tables name it: fork-join ones with their size, "fib(30)".
std::string workload_label(Workload w);

// The results as a JSON array (bench/report.py's input); exits on a write
// error.
void write_json(const std::string& path, const Options& o, const std::vector<Summary>& rows,
                const std::vector<LatencySummary>& latency, const std::vector<Skip>& skips,
                const Extras& extras);
// The results as tables on stdout.
void print_table(const Options& o, const std::vector<Summary>& rows,
                 const std::vector<LatencySummary>& latency, const std::vector<Skip>& skips,
                 const Extras& extras);

}  // namespace bench

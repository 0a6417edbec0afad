// bench/crew_extras.hpp: crew-only measurements that are not per-task
// throughput (see impl_crew.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bench {

// Process CPU time while an idle crew pool waits.
struct IdleCpu {
  std::string config;  // "default" or "min_workers_2"
  double seconds = 0;
  double cpu_percent = 0;   // of one core
  std::size_t workers = 0;  // live workers at the end of the window
};
std::vector<IdleCpu> measure_idle_cpu(double seconds);

// RSS added by `tasks` small tasks queued on a paused pool.
struct QueuedMemory {
  std::size_t tasks = 0;
  double rss_mb = 0;  // MiB
  double bytes_per_task = 0;
  double allocs_per_task = 0;
  double post_ns_per_task = 0;
};
QueuedMemory measure_queued_memory(std::size_t tasks);

// Steady-state allocations of post() with a 48-byte callable.
struct PostAllocs {
  std::size_t tasks = 0;
  std::size_t callable_bytes = 0;
  double allocs_per_task = 0;
  double ns_per_task = 0;
};
PostAllocs measure_post_allocs(std::size_t tasks);

// Shutdown latency under load (shutdown_latency.cpp).
struct ShutdownLatency {
  int runs = 0;
  std::size_t hard_tasks = 1000;  // cooperative long tasks running
  double hard_ms = 0, hard_max_ms = 0;
  std::size_t soft_tasks = 1'000'000;  // small tasks queued
  double soft_ms = 0, soft_max_ms = 0;
  std::uint64_t soft_rejected = 0;  // as reported by the shutdown
};
ShutdownLatency measure_shutdown_latency(int runs);

// One scrape of a PrometheusMetrics exporting `pools` x `task_names` series
// sets (impl_crew_metrics.cpp): Collect() plus crew::text_exposition, and
// prometheus::TextSerializer on the same families for comparison.
struct MetricsScrape {
  int runs = 0;
  std::size_t pools = 10;
  std::size_t task_names = 100;
  double ms = 0, ms_max = 0;  // Collect() + text_exposition, median and max
  double collect_ms = 0, text_ms = 0, text_serializer_ms = 0;  // medians
  std::size_t bytes = 0, lines = 0;                            // of the exposition
};
MetricsScrape measure_metrics_scrape(int runs);

}  // namespace bench

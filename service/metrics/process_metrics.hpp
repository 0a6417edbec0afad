// service/metrics/process_metrics.hpp: metrics of the crewd process itself, read
// from /proc at scrape time, under the names Prometheus client libraries use:
//
//   process_cpu_seconds_total        user + system CPU time
//   process_resident_memory_bytes    RSS
//   process_virtual_memory_bytes
//   process_open_fds, process_max_fds
//   process_threads                  threads of the process
//   process_start_time_seconds       since the Unix epoch
//   crewd_usable_cpus                the CPUs crewd's defaults are sized
//                                    from (crew::usable_cpus())
//
// Linux only. A file that cannot be read leaves its metric out of that
// scrape rather than failing it.
//
// Thread safety: Collect() may run concurrently with itself.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace crewd {

struct ProcessSample {
  std::optional<double> cpu_seconds;
  std::optional<std::uint64_t> resident_bytes;
  std::optional<std::uint64_t> virtual_bytes;
  std::optional<std::uint64_t> open_fds;
  std::optional<std::uint64_t> max_fds;
  std::optional<std::uint64_t> threads;
  std::optional<double> start_time_seconds;
};

[[nodiscard]] ProcessSample read_process_sample();

class ProcessMetrics final : public prometheus::Collectable {
 public:
  [[nodiscard]] std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace crewd

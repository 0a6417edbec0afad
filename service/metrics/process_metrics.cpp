#include "metrics/process_metrics.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <crew/usable_cpus.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "metrics/metric_family.hpp"

namespace crewd {
namespace {

std::optional<std::string> read_file(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Fields of /proc/self/stat after the command name, which may itself hold
// spaces and parentheses: split after the last ')'. fields[0] is field 3
// (state) of proc(5).
std::vector<std::string> stat_fields() {
  std::vector<std::string> fields;
  const auto stat = read_file("/proc/self/stat");
  if (!stat) return fields;
  const auto close = stat->rfind(')');
  if (close == std::string::npos) return fields;
  std::istringstream in(stat->substr(close + 1));
  std::string f;
  while (in >> f) fields.push_back(f);
  return fields;
}

std::optional<std::uint64_t> to_u64(const std::string& s) {
  try {
    return std::stoull(s);
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<double> boot_time_seconds() {
  const auto stat = read_file("/proc/stat");
  if (!stat) return std::nullopt;
  const auto pos = stat->find("\nbtime ");
  if (pos == std::string::npos) return std::nullopt;
  const auto v = to_u64(stat->substr(pos + 7, stat->find('\n', pos + 7) - pos - 7));
  if (!v) return std::nullopt;
  return static_cast<double>(*v);
}

}  // namespace

ProcessSample read_process_sample() {
  ProcessSample s;
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    const auto secs = [](const timeval& tv) {
      return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
    };
    s.cpu_seconds = secs(usage.ru_utime) + secs(usage.ru_stime);
  }
  const long page = sysconf(_SC_PAGESIZE);
  if (const auto statm = read_file("/proc/self/statm"); statm && page > 0) {
    std::istringstream in(*statm);
    std::uint64_t size = 0;
    std::uint64_t resident = 0;
    if (in >> size >> resident) {
      s.virtual_bytes = size * static_cast<std::uint64_t>(page);
      s.resident_bytes = resident * static_cast<std::uint64_t>(page);
    }
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    std::uint64_t n = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(dir);
    s.open_fds = n - 1;  // not counting the descriptor of the listing itself
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    s.max_fds = static_cast<std::uint64_t>(limit.rlim_cur);
  }
  const auto fields = stat_fields();
  // proc(5): num_threads is field 20, starttime (clock ticks after boot) 22.
  if (fields.size() > 19) s.threads = to_u64(fields[17]);
  const long ticks = sysconf(_SC_CLK_TCK);
  if (fields.size() > 19 && ticks > 0) {
    const auto start = to_u64(fields[19]);
    const auto boot = boot_time_seconds();
    if (start && boot)
      s.start_time_seconds = *boot + static_cast<double>(*start) / static_cast<double>(ticks);
  }
  return s;
}

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  using prometheus::MetricType;
  const ProcessSample s = read_process_sample();
  std::vector<prometheus::MetricFamily> out;
  if (s.cpu_seconds) {
    out.push_back(one_sample_family("process_cpu_seconds_total",
                                    "Total user and system CPU time spent in seconds",
                                    MetricType::Counter, *s.cpu_seconds));
  }
  if (s.resident_bytes) {
    out.push_back(one_sample_family("process_resident_memory_bytes",
                                    "Resident memory size in bytes", MetricType::Gauge,
                                    static_cast<double>(*s.resident_bytes)));
  }
  if (s.virtual_bytes) {
    out.push_back(one_sample_family("process_virtual_memory_bytes", "Virtual memory size in bytes",
                                    MetricType::Gauge, static_cast<double>(*s.virtual_bytes)));
  }
  if (s.open_fds) {
    out.push_back(one_sample_family("process_open_fds", "Number of open file descriptors",
                                    MetricType::Gauge, static_cast<double>(*s.open_fds)));
  }
  if (s.max_fds) {
    out.push_back(one_sample_family("process_max_fds", "Maximum number of open file descriptors",
                                    MetricType::Gauge, static_cast<double>(*s.max_fds)));
  }
  if (s.threads) {
    out.push_back(one_sample_family("process_threads", "Number of OS threads in the process",
                                    MetricType::Gauge, static_cast<double>(*s.threads)));
  }
  if (s.start_time_seconds) {
    out.push_back(one_sample_family("process_start_time_seconds",
                                    "Start time of the process since unix epoch in seconds",
                                    MetricType::Gauge, *s.start_time_seconds));
  }
  out.push_back(one_sample_family(
      "crewd_usable_cpus",
      "CPUs the process can use: its affinity mask capped by its cgroup CPU quota, rounded up",
      MetricType::Gauge, static_cast<double>(crew::usable_cpus())));
  return out;
}

}  // namespace crewd

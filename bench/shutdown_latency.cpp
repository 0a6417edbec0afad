// bench/shutdown_latency.cpp: how long crew's shutdown modes take under load.
//
//   hard_1000: 1,000 cooperative long tasks running on 1,000 workers (each
//              waits on a condition variable through its stop token); time
//              from shutdown(hard) to its return.
//   soft_1m:   1,000,000 small tasks queued on a paused pool; time from
//              shutdown(soft) to its return, and how many it reported
//              rejected.
// Each is measured `runs` times; medians are reported.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <crew/pool.hpp>
#include <latch>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

#include "crew_extras.hpp"
#include "harness.hpp"

namespace bench {
namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

double hard_with_running_tasks(std::size_t tasks) {
  crew::Pool pool({.name = "hard", .max_workers = tasks, .queue_capacity = tasks});
  std::latch running(static_cast<std::ptrdiff_t>(tasks));
  for (std::size_t i = 0; i < tasks; ++i) {
    // Each task blocks on its own mutex and condition variable until its
    // token is stopped (a shared one would time the convoy of 1,000 threads
    // on one mutex, not the pool).
    const crew::Admission a = pool.post([&running](std::stop_token stop) {
      std::mutex mu;
      std::condition_variable_any cv;
      running.count_down();
      std::unique_lock lock(mu);
      cv.wait(lock, stop, [] { return false; });
    });
    if (a != crew::Admission::accepted) fail("hard_1000: a task was refused");
  }
  running.wait();
  const auto start = std::chrono::steady_clock::now();
  const crew::ShutdownReport r = pool.shutdown(crew::ShutdownMode::hard, std::chrono::seconds(0));
  const double ms = ms_since(start);
  if (r.during.cancelled != tasks || !r.abandoned.empty()) fail("hard_1000: wrong report");
  return ms;
}

std::pair<double, std::uint64_t> soft_with_queued_tasks(std::size_t tasks) {
  crew::Pool pool({.name = "soft", .max_workers = 2, .queue_capacity = crew::kUnbounded});
  pool.pause();
  for (std::size_t i = 0; i < tasks; ++i) {
    if (pool.post([] {}) != crew::Admission::accepted) fail("soft_1m: a task was refused");
  }
  const auto start = std::chrono::steady_clock::now();
  const crew::ShutdownReport r = pool.shutdown(crew::ShutdownMode::soft, std::chrono::seconds(0));
  return {ms_since(start), r.rejected_unnamed + r.rejected.size()};
}

}  // namespace

ShutdownLatency measure_shutdown_latency(int runs) {
  ShutdownLatency out;
  std::vector<double> hard, soft;
  for (int i = 0; i < runs; ++i) {
    hard.push_back(hard_with_running_tasks(out.hard_tasks));
    const auto [ms, rejected] = soft_with_queued_tasks(out.soft_tasks);
    soft.push_back(ms);
    out.soft_rejected = rejected;
  }
  out.runs = runs;
  out.hard_ms = median_of(hard);
  out.hard_max_ms = *std::max_element(hard.begin(), hard.end());
  out.soft_ms = median_of(soft);
  out.soft_max_ms = *std::max_element(soft.begin(), soft.end());
  return out;
}

}  // namespace bench

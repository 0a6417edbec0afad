#include "jobs/job_runner.hpp"

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace crewd {

bool sleep_until(std::chrono::steady_clock::time_point until, const std::stop_token& stop) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  (void)cv.wait_until(lock, stop, until, [] { return false; });
  return !stop.stop_requested();
}

bool run_job_until(const JobRequest& job, std::chrono::steady_clock::time_point until,
                   const std::stop_token& stop) {
  if (job.kind == JobKind::sleep) return sleep_until(until, stop);
  if (job.kind == JobKind::stuck) return sleep_until(until, std::stop_token());
  volatile std::uint64_t sink = 0;
  std::uint64_t x = 1;
  while (std::chrono::steady_clock::now() < until) {
    if (stop.stop_requested()) return false;
    for (int i = 0; i < 2000; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
  }
  (void)sink;
  return true;
}

}  // namespace crewd

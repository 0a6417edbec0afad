// service/jobs/job_runner.hpp: how crewd runs a job, whether it came from
// POST /api/v1/jobs or from a Redis stream entry.
#pragma once

#include <chrono>
#include <stop_token>

#include "jobs/jobs.hpp"

namespace crewd {

// Sleeps until `until` or until `stop` is requested; false if stopped.
bool sleep_until(std::chrono::steady_clock::time_point until, const std::stop_token& stop);

// Runs `job` until `until`: a sleep job waits on `stop`; a spin job burns CPU
// in slices of about a microsecond, checking `stop` between them; a stuck
// job sleeps until `until` whatever `stop` says. Returns
// false if `stop` ended it before `until`.
bool run_job_until(const JobRequest& job, std::chrono::steady_clock::time_point until,
                   const std::stop_token& stop);

}  // namespace crewd

// crewd's job routes (POST /api/v1/jobs): the handler, the checks from a
// request's head and before its body, and the answer of a job once it
// ended. Handlers run on the connection's I/O thread (routes.hpp).
#pragma once

#include <optional>

#include "http/routes.hpp"

namespace crewd::http {

// Parses the job, takes a jobs.max_in_flight slot and hands the job to the
// jobs pool: a sleep or call job as a coroutine task, the others as thread
// tasks. Answers from the task's completion, on this I/O thread.
void job(Exchange& ex);
// Before the body of a request that expects 100-continue: the 503 a full
// pool or jobs.max_in_flight would give, or nothing.
[[nodiscard]] std::optional<Response> job_expect_body(const State& s);
// From the request's head: the 400 of a bad X-Priority or X-Deadline-Ms,
// the 503 of jobs.max_in_flight or of the jobs pool's admission limit, or
// the 503 (reason deadline) of an X-Deadline-Ms shorter than the pool's
// queue-wait estimate; or nothing.
[[nodiscard]] std::optional<Response> jobs_admit_head(const State& s, const Request& req);

}  // namespace crewd::http

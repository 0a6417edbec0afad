// Responses crewd's routes share (routes.cpp, job_routes.cpp): JSON
// bodies, and the 503 of a pool its overload controller refused or shed.
// Called on a connection's I/O thread, or on any thread: none keeps state
// but overload_retry_after's per-thread jitter.
#pragma once

#include <chrono>
#include <crew/pool.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "http/request.hpp"

namespace crewd::http {

using Json = nlohmann::ordered_json;

// A JSON body; invalid UTF-8 in a string is replaced, never thrown on.
[[nodiscard]] std::string dump(const Json& j);
[[nodiscard]] Response json_response(int status, const Json& body);

// The `reason` of a 503/504 body for a task that ended with `e`: a
// snake_case token (docs/crewd.md lists them all), never crew::to_string's
// text, which goes to `error`. The overload controller's reason (limit,
// codel, priority, deadline, rate) when it refused or shed the task; the
// admission (closed, full, too_many_blocked) for another refusal; else the
// error's name (expired, shutdown_dropped, cancelled, timed_out, ...).
[[nodiscard]] std::string reason_of(const crew::Error& e);

// Retry-After of an overloaded pool's 503 (seconds).
[[nodiscard]] int overload_retry_after(std::chrono::nanoseconds wait_estimate);
// The 503 of a request `pool` refused or shed for `reason`.
[[nodiscard]] Response overload_response(const crew::Pool& pool, crew::OverloadReason reason,
                                         std::chrono::nanoseconds wait_estimate);
// A route's admit_head: refuses from the request's head while `pool`'s
// admission limit is reached.
[[nodiscard]] std::optional<Response> refuse_if_overloaded(crew::Pool& pool);

}  // namespace crewd::http

// Responses crewd's routes share (responses.hpp).
#include "http/responses.hpp"

#include <algorithm>
#include <cstdint>
#include <random>

#include "http/server_state.hpp"

namespace crewd::http {

std::string dump(const Json& j) {
  // replace: a string holding invalid UTF-8 must not turn into an exception.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Response json_response(int status, const Json& body) {
  Response r;
  r.status = status;
  r.body = dump(body);
  return r;
}

// Retry-After of an overloaded pool's 503: its queue-wait estimate in whole
// seconds (at least 1), plus up to as much again at random, so that the
// refused clients do not all come back at once.
int overload_retry_after(std::chrono::nanoseconds wait_estimate) {
  const auto base =
      std::max<std::int64_t>(1, std::chrono::ceil<std::chrono::seconds>(wait_estimate).count());
  thread_local std::minstd_rand jitter(
      static_cast<std::uint32_t>(Clock::now().time_since_epoch().count()));
  const std::int64_t secs =
      base + static_cast<std::int64_t>(jitter() % static_cast<std::uint64_t>(base + 1));
  return static_cast<int>(std::min<std::int64_t>(secs, 3600));
}

std::string reason_of(const crew::Error& e) {
  if (e.overload_reason() != crew::OverloadReason::none) {
    return std::string(crew::to_string(e.overload_reason()));
  }
  switch (e.code()) {
    case crew::Errc::rejected:
      return std::string(crew::to_string(e.admission()));
    case crew::Errc::invalid_options:
      return "invalid_options";
    case crew::Errc::shutdown_dropped:
      return "shutdown_dropped";
    case crew::Errc::expired:
      return "expired";
    case crew::Errc::cancelled:
      return "cancelled";
    case crew::Errc::timed_out:
      return "timed_out";
    case crew::Errc::abandoned:
      return "abandoned";
    case crew::Errc::empty_handle:
      return "empty_handle";
    case crew::Errc::would_deadlock:
      return "would_deadlock";
    case crew::Errc::stack_exhausted:
      return "stack_exhausted";
    case crew::Errc::overloaded:
      return "overloaded";
    case crew::Errc::wait_in_fork:
      return "wait_in_fork";
  }
  return "failed";
}

// The 503 of a request `pool` refused or shed for `reason`.
Response overload_response(const crew::Pool& pool, crew::OverloadReason reason,
                           std::chrono::nanoseconds wait_estimate) {
  const std::string why(crew::to_string(reason));
  Response r = json_response(
      503, Json{{"error", "pool " + std::string(pool.name()) + " is overloaded (" + why + ")"},
                {"outcome",
                 reason == crew::OverloadReason::codel || reason == crew::OverloadReason::priority
                     ? "shed"
                     : "rejected"},
                {"pool", pool.name()},
                {"reason", why},
                {"status", 503}});
  r.retry_after = overload_retry_after(wait_estimate);
  return r;
}

// A route's admit_head: refuses from the request's head while `pool`'s
// admission limit is reached.
std::optional<Response> refuse_if_overloaded(crew::Pool& pool) {
  const crew::OverloadHint h = pool.refuse_if_overloaded();
  if (h.reason == crew::OverloadReason::none) return std::nullopt;
  return overload_response(pool, h.reason, h.wait_estimate);
}

}  // namespace crewd::http

// service/jobs/jobs.hpp: crewd's request layer. Turns what a client sends (the
// {n} of /api/v1/factorial/{n}, the JSON body of POST /api/v1/jobs) into a
// validated request, or into the message of a 400 response.
//
// Pure functions over untrusted bytes: no I/O, no pool, no global state. This
// is the layer the libFuzzer target (service/fuzz/jobs_fuzzer.cpp) drives, so
// every input, however malformed, must end in a value or a ParseError, never
// in an exception or undefined behaviour.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace crewd {

// Why a request was refused; becomes the "error" of a 400 response. Never
// echoes raw input: names the field and the accepted range.
struct ParseError {
  std::string message;
};

// n! fits in uint64_t up to 20!.
inline constexpr unsigned kMaxFactorialN = 20;

[[nodiscard]] constexpr std::uint64_t factorial(unsigned n) noexcept {
  std::uint64_t r = 1;
  for (unsigned i = 2; i <= n; ++i) r *= i;
  return r;
}

// The {n} path segment: decimal digits only (no sign, no spaces), 0..20;
// any number of leading zeros ("0000000005" is 5).
[[nodiscard]] std::variant<unsigned, ParseError> parse_factorial_n(std::string_view segment);

enum class JobKind : std::uint8_t {
  sleep,  // waits on its stop token: an I/O-bound call to another service
  spin,   // burns CPU, checking its stop token: CPU-bound work
  // Sleeps without looking at its stop token: a call that cannot be
  // interrupted. For tests of deadlines and write-offs (abandoned workers);
  // accepted only with JobLimits::allow_stuck (jobs.allow_stuck).
  stuck,
  // An HTTP GET to the downstream of jobs.call_url: waits for its answer
  // and reports its status. Accepted only with JobLimits::allow_call (a
  // jobs.call_url is set); takes no "ms".
  call,
};

[[nodiscard]] std::string_view to_string(JobKind kind) noexcept;

// Bounds of a job request (config [jobs]; docs/crewd.md, "Limits").
struct JobLimits {
  std::uint32_t max_ms = 10'000;             // "ms": 0..max_ms
  std::uint32_t max_timeout_ms = 60'000;     // "timeout_ms": 1..max_timeout_ms
  std::uint32_t default_timeout_ms = 5'000;  // when "timeout_ms" is absent
  bool allow_stuck = false;                  // kind "stuck" accepted
  bool allow_call = false;                   // kind "call" accepted (jobs.call_url is set)
};

inline constexpr std::size_t kMaxJobNameLength = 64;

struct JobRequest {
  JobKind kind = JobKind::sleep;
  std::uint32_t ms = 0;
  std::uint32_t timeout_ms = 0;
  // The task's name in reports, worker snapshots and metrics; the kind when
  // the client gave none. 1..64 of [A-Za-z0-9._:-].
  std::string name;

  friend bool operator==(const JobRequest&, const JobRequest&) = default;
};

// The body of POST /api/v1/jobs:
//   {"kind": "sleep"|"spin"|"stuck"|"call", "ms": N, "timeout_ms": M, "name": "..."}
// kind is required, and ms for every kind but call (which refuses it);
// unknown fields are refused (a typo must not silently fall back to a
// default).
[[nodiscard]] std::variant<JobRequest, ParseError> parse_job_request(std::string_view body,
                                                                     const JobLimits& limits);

// A job's priority: the level of the jobs pool it is queued at
// (crew::TaskOptions::priority; the pool has kJobPriorityLevels). Higher
// levels start first; a waiting lower level is still served after
// crew::PoolOptions::priority_aging tasks from above it.
enum class JobPriority : std::uint8_t { low = 0, normal = 1, high = 2 };
inline constexpr std::size_t kJobPriorityLevels = 3;

[[nodiscard]] std::string_view to_string(JobPriority p) noexcept;

// What a job request says in its head, read before its body:
//   X-Priority: high | normal | low (any case), or the level 0..2
//   X-Deadline-Ms: 1..limits.max_timeout_ms, the milliseconds from the
//     head's arrival within which the job must start (its queue deadline)
struct JobHeaders {
  JobPriority priority = JobPriority::normal;
  std::optional<std::uint32_t> deadline_ms;  // none: jobs.queue_timeout_ms alone

  friend bool operator==(const JobHeaders&, const JobHeaders&) = default;
};

// The two fields' values as sent (nullopt: absent). A ParseError names the
// header and what it must be; it never echoes the value.
[[nodiscard]] std::variant<JobHeaders, ParseError> parse_job_headers(
    const std::optional<std::string>& priority, const std::optional<std::string>& deadline_ms,
    const JobLimits& limits);

// An http:// URL without user info, query or fragment: what jobs.call_url
// holds. The host is an IPv4 address or a name (resolved when crewd starts),
// the port 1..65535 (80 when absent), the target the path ("/" when absent).
struct HttpUrl {
  std::string host;
  std::uint16_t port = 80;
  std::string target = "/";

  friend bool operator==(const HttpUrl&, const HttpUrl&) = default;
};
[[nodiscard]] std::optional<HttpUrl> parse_http_url(std::string_view url);

}  // namespace crewd

// libFuzzer target for crewd's request layer (service/jobs.hpp): the {n} of
// /api/v1/factorial/{n} and the JSON body of POST /api/v1/jobs, the two
// places where client bytes become a request. Whatever the input, parsing
// must end in a value within the limits or in a 400 message that is
// printable ASCII (it never echoes raw input), without a crash, an
// exception, a leak or undefined behaviour (built with ASan and UBSan).
//
//   make fuzz                      # builds with clang, runs 60 s
//   make fuzz FUZZ_SECONDS=600
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <variant>

#include "jobs.hpp"

namespace {

void require(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

void check_message(const crewd::ParseError& e) {
  require(!e.message.empty() && e.message.size() < 256);
  for (const char c : e.message) require(c >= 0x20 && c < 0x7f);
}

void check_factorial(std::string_view segment) {
  const auto r = crewd::parse_factorial_n(segment);
  if (const auto* e = std::get_if<crewd::ParseError>(&r)) return check_message(*e);
  const unsigned n = std::get<unsigned>(r);
  require(n <= crewd::kMaxFactorialN);
  unsigned value = 0;  // the segment is digits only, and says n
  for (const char c : segment) {
    require(c >= '0' && c <= '9');
    value = value * 10 + static_cast<unsigned>(c - '0');
    require(value <= crewd::kMaxFactorialN);
  }
  require(value == n);
}

void check_job(std::string_view body, const crewd::JobLimits& limits) {
  const auto r = crewd::parse_job_request(body, limits);
  if (const auto* e = std::get_if<crewd::ParseError>(&r)) return check_message(*e);
  const crewd::JobRequest& job = std::get<crewd::JobRequest>(r);
  require(job.kind == crewd::JobKind::sleep || job.kind == crewd::JobKind::spin);
  require(job.ms <= limits.max_ms);
  require(job.timeout_ms >= 1 && job.timeout_ms <= limits.max_timeout_ms);
  require(!job.name.empty() && job.name.size() <= crewd::kMaxJobNameLength);
  for (const char c : job.name) {
    require((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '_' || c == ':' || c == '-');
  }
  // Pure: the same bytes give the same request.
  const auto again = crewd::parse_job_request(body, limits);
  require(std::holds_alternative<crewd::JobRequest>(again) &&
          std::get<crewd::JobRequest>(again) == job);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  check_factorial(input);
  check_job(input, crewd::JobLimits{});
  check_job(input, crewd::JobLimits{.max_ms = 0, .max_timeout_ms = 1, .default_timeout_ms = 1});
  return 0;
}

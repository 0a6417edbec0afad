// libFuzzer target for crewd's request layer, on raw bytes: what a client
// sends on a connection goes through RequestParser (service/http/request.hpp:
// Beast's parser with crewd's limits), each request it yields through
// match_path (how the route table matches), and the {n} of a factorial or
// the body of a job through parse_factorial_n / parse_job_request
// (service/jobs/jobs.hpp). The input is also given to those two directly,
// so that the JSON layer is fuzzed as deeply as before.
//
// Whatever the input: no crash, exception, leak or undefined behaviour
// (built with ASan and UBSan); every request within the limits; every error
// a known status with a printable message; the same requests whether the
// bytes arrive all at once, one by one, or in between (the parser must not
// depend on how the network splits them). Only where a bad head is noticed
// may differ: Beast finds some errors as soon as it sees them when the head
// arrives in one piece, but waits for the head's end when it trickles in
// (then the head deadline or the header limit ends it).
//
//   make fuzz                      # builds with clang, runs 60 s
//   make fuzz FUZZ_SECONDS=600
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "http/request.hpp"
#include "jobs/jobs.hpp"

namespace {

void require(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

void check_text(std::string_view message) {
  require(!message.empty() && message.size() < 256);
  for (const char c : message) require(c >= 0x20 && c < 0x7f);
}

void check_factorial(std::string_view segment) {
  const auto r = crewd::parse_factorial_n(segment);
  if (const auto* e = std::get_if<crewd::ParseError>(&r)) return check_text(e->message);
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
  if (const auto* e = std::get_if<crewd::ParseError>(&r)) return check_text(e->message);
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

// Small limits, so that inputs reach them.
const crewd::HttpLimits kLimits{.header_bytes = 1024, .header_count = 16, .body_bytes = 2048};

// One request or the error that ended the connection, as the connection
// layer sees it.
struct Event {
  bool error = false;
  int status = 0;
  std::string method, target, body;
  int version = 0;
  bool keep_alive = false;
  bool expect_continue = false;
  friend bool operator==(const Event&, const Event&) = default;
};

// Patterns shaped as crewd's routes (service/http/routes.cpp): one with a
// "{name}" segment and text after it, one with it last, literal ones. The
// table itself needs the server (its handlers); match_path and
// method_listed are what it matches with.
struct FuzzRoute {
  std::string_view path, methods;
  bool factorial = false, job = false;
};
constexpr FuzzRoute kFuzzRoutes[] = {
    {.path = "/api/v1/factorial/{n}", .methods = "GET, HEAD", .factorial = true},
    {.path = "/api/v1/jobs", .methods = "POST", .job = true},
    {.path = "/api/v1/items/{id}/state", .methods = "GET, HEAD, PUT"},
    {.path = "/metrics", .methods = "GET, HEAD"},
};

void check_request(crewd::Request& req) {
  require(!req.method.empty() && !req.target.empty());
  require(req.version == 10 || req.version == 11);
  require(req.fields <= kLimits.header_count);
  require(req.body.size() <= kLimits.body_bytes);
  const std::string_view path = req.path();
  for (const FuzzRoute& route : kFuzzRoutes) {
    const std::optional<std::string_view> arg = crewd::match_path(route.path, path);
    if (!arg) continue;
    const bool placeholder = route.path.find('{') != std::string_view::npos;
    require(placeholder ? !arg->empty() && arg->find('/') == std::string_view::npos
                        : arg->empty() && path == route.path);
    // The argument is a piece of the path.
    require(arg->empty() ||
            (arg->data() >= path.data() && arg->data() + arg->size() <= path.data() + path.size()));
    if (route.factorial) check_factorial(*arg);
    if (route.job && crewd::method_listed(route.methods, req.method)) {
      check_job(req.body, crewd::JobLimits{});
    }
    break;
  }
  // What crewd would answer is a well-formed response.
  crewd::Response r = crewd::error_response(404, "no such route");
  std::string out;
  crewd::append_response(out, r, req.method == "HEAD");
  require(out.starts_with("HTTP/1.1 404 Not Found\r\n"));
}

// Feeds `input` to parsers `step` bytes at a time, as a connection would:
// one request after the other (pipelining), until an error closes it.
std::vector<Event> run(std::string_view input, std::size_t step) {
  std::vector<Event> events;
  std::string buffer;
  std::size_t pos = 0;
  std::optional<crewd::RequestParser> parser;
  for (;;) {
    // Parse what is buffered as far as it goes.
    for (;;) {
      if (!parser) {
        if (buffer.empty()) break;
        parser.emplace(kLimits);
      }
      const std::size_t n = parser->feed(buffer);
      require(n <= buffer.size());
      buffer.erase(0, n);
      if (parser->failed()) {
        const crewd::RequestError& e = parser->error();
        require(e.status == 400 || e.status == 413 || e.status == 414 || e.status == 431 ||
                e.status == 501);
        check_text(e.message);
        std::string out;
        crewd::append_response(out, crewd::error_response(e.status, e.message), false);
        require(out.starts_with("HTTP/1.1 "));
        events.push_back(Event{.error = true, .status = e.status});
        return events;  // the connection is closed after an error
      }
      if (parser->done()) {
        crewd::Request& req = parser->request();
        check_request(req);
        events.push_back(Event{.method = req.method,
                               .target = req.target,
                               .body = req.body,
                               .version = req.version,
                               .keep_alive = req.keep_alive,
                               .expect_continue = req.expect_continue});
        parser.reset();
        continue;
      }
      if (n == 0) break;  // needs more
    }
    if (pos >= input.size()) return events;
    const std::size_t take = std::min(step, input.size() - pos);
    buffer.append(input.data() + pos, take);
    pos += take;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  // The JSON and {n} layer, directly.
  check_factorial(input);
  check_job(input, crewd::JobLimits{});
  check_job(input, crewd::JobLimits{.max_ms = 0, .max_timeout_ms = 1, .default_timeout_ms = 1});
  // The HTTP layer: all at once, one byte at a time, and in between.
  if (size > 64 * 1024) return 0;
  const auto requests = [](std::vector<Event> events) {
    if (!events.empty() && events.back().error) events.pop_back();
    for (const Event& e : events) require(!e.error);  // an error ends the connection
    return events;
  };
  const std::vector<Event> whole = requests(run(input, size == 0 ? 1 : size));
  require(requests(run(input, 1)) == whole);
  require(requests(run(input, 7)) == whole);
  return 0;
}

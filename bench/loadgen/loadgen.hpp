// bench/loadgen/loadgen.hpp: an open-loop HTTP/1.1 load generator.
//
// run() sends requests at the times of a precomputed schedule
// (schedule.hpp), whatever the server does, over keep-alive connections,
// and never pipelines: a request goes out on a connection only once the
// previous response on it has been read. When no connection is free at a
// send time it opens another, up to max_connections; past that the request
// waits for a free one and its send is late (counted). Every latency is
// taken from the request's scheduled send time, so time a request spent
// waiting for a connection, or for a late event loop, is part of it: the
// figures do not suffer from coordinated omission.
//
// One thread: run() does all its I/O on the calling thread (epoll, a
// timerfd armed at the next send time) and returns when every request has
// an outcome. Calls from several threads at once are independent runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "schedule.hpp"

namespace loadgen {

struct Target {
  std::string host = "127.0.0.1";  // a numeric IPv4 or IPv6 address, or a name
  std::string port = "80";
  std::string path = "/";
};

// "http://HOST[:PORT][/PATH]"; false if it is not one.
[[nodiscard]] bool parse_url(const std::string& url, Target& out);

struct Options {
  Target target;
  std::string method = "GET";
  std::vector<std::string> headers;  // "Name: value" lines added to each request
  std::vector<std::string> bodies;   // Phase::body picks one; none: no body
  std::vector<Phase> phases;
  std::uint64_t seed = 1;
  std::int64_t slo_ns = 50'000'000;         // goodput: 2xx answered within this
  std::int64_t timeout_ns = 5'000'000'000;  // from the scheduled send to giving up
  std::int64_t late_ns = 1'000'000;         // a send this far behind schedule is late
  unsigned connections = 16;                // opened before the first send
  unsigned max_connections = 4096;
  // Called on the thread running run(), never after it returns, once a
  // second ends, with that second's line (per_second_line()); may be empty.
  std::function<void(const std::string&)> on_second;
};

struct Percentiles {
  std::uint64_t count = 0;
  double mean_ms = 0, p50_ms = 0, p99_ms = 0, p999_ms = 0, max_ms = 0;
};

// The nearest-rank percentiles of `ns` (sorted in place), in milliseconds.
Percentiles percentiles(std::vector<std::int64_t>& ns);

// One second of the run. Scheduled counts by scheduled time, sent by send
// time, the rest by the time the outcome arrived.
struct Second {
  std::uint64_t scheduled = 0, sent = 0, late = 0;
  std::uint64_t answered = 0, ok = 0, goodput = 0, rejected = 0, errors = 0;
  unsigned connections = 0;  // open at the end of the second
  Percentiles latency;       // answered requests
};

struct Result {
  double seconds = 0;      // length of the schedule
  double target_rate = 0;  // scheduled / seconds
  std::uint64_t scheduled = 0, sent = 0, late = 0;
  double achieved_rate = 0;  // sends per second between the first and last send
  double interarrival_mean_ms = 0;
  Percentiles send_lag;  // actual send time minus scheduled
  std::uint64_t answered = 0, goodput = 0;
  std::map<int, std::uint64_t> status;           // answered requests by status code
  std::map<std::string, std::uint64_t> reasons;  // non-2xx by "STATUS REASON"
  std::map<std::string, std::uint64_t> errors;  // no answer: connect, closed, timeout, bad_response
  Percentiles latency;                          // every answered request, from its scheduled time
  Percentiles latency_ok;                       // 2xx
  Percentiles service;                          // every answered request, from its actual send
  Percentiles rejection;                        // non-2xx answers
  std::map<std::string, Percentiles> rejection_by_reason;
  unsigned connections_opened = 0, max_open = 0;
  std::vector<Second> per_second;
};

// Runs the schedule of `options` against its target. Blocks the calling
// thread until every request has been answered, has failed or has timed
// out (timeout_ns after its scheduled time). Throws std::runtime_error when
// the target does not resolve or a system call the run needs fails.
[[nodiscard]] Result run(const Options& options);

[[nodiscard]] std::string per_second_line(std::size_t second, const Second& s);
[[nodiscard]] std::string summary_json(const Result& r, const Options& options);

}  // namespace loadgen

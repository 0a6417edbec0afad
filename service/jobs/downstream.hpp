// service/jobs/downstream.hpp: the HTTP GET of a "call" job (jobs.call_url),
// awaited by the job's coroutine task: while the request is on the wire the
// job holds no thread. The request's I/O runs on an Asio executor (an I/O
// thread of crewd's server); its end resumes the coroutine on a worker of
// the jobs pool (crew::on_callback).
//
// Threads: Downstream is made once on main's thread and read-only after
// (any thread). call_downstream runs inside a coroutine task; its socket is
// touched only on `io`'s thread, including the cancellation a stop of the
// task posts there.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <crew/coro.hpp>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "jobs/jobs.hpp"

namespace crewd {

// Where call jobs go: the resolved addresses of jobs.call_url's host, its
// Host header and its target.
struct Downstream {
  std::vector<boost::asio::ip::tcp::endpoint> endpoints;
  std::string host;    // the Host header: host[:port]
  std::string target;  // the path sent
  std::string url;     // as configured, for messages
};

// Resolves `url` (blocks on the resolver); throws std::runtime_error with
// the resolver's reason when the host does not resolve.
[[nodiscard]] Downstream resolve_downstream(const HttpUrl& url, std::string text);

// The downstream's answer to a call job.
struct DownstreamAnswer {
  unsigned status = 0;         // its HTTP status, whatever it is
  std::size_t body_bytes = 0;  // the body's size (the body itself is dropped)
};

// A call that got no answer: the connection failed or broke (timed_out
// false), or no full answer came within the call's timeout (timed_out true).
class DownstreamError : public std::runtime_error {
 public:
  DownstreamError(const std::string& what, bool timed_out)
      : std::runtime_error(what), timed_out_(timed_out) {}
  [[nodiscard]] bool timed_out() const noexcept { return timed_out_; }

 private:
  bool timed_out_;
};

// GET of the downstream's target on a new connection (Connection: close),
// its I/O on `io`, bounded by `timeout` from connect to the answer's end.
// Only from a coroutine task: suspends without holding a thread. Returns
// the answer; throws DownstreamError without one; a stop of the task ends
// the wait at once (crew::Error, as any co_await) and cancels the request.
[[nodiscard]] crew::Co<DownstreamAnswer> call_downstream(boost::asio::any_io_executor io,
                                                         const Downstream& to,
                                                         std::chrono::milliseconds timeout);

}  // namespace crewd

// service/http/server_state.hpp: what crewd's HTTP server shares between its
// parts (internal to server.cpp, routes.cpp, connection.cpp, io_thread.cpp): the
// server's State, the I/O threads' timing constants and small helpers.
//
// HttpServer::State is shared by the server object, its I/O threads and
// the tasks it submits (they hold a shared_ptr, so a task that outlives the
// server never touches freed memory). Who touches which field:
//   config, limits, pools, log, requests, exposed: set at construction,
//     read-only after (any thread).
//   readiness_checks, console: set before serve(), read by the I/O threads.
//   max_connections, max_lingering: set by HttpServer's constructor,
//     read-only after.
//   gate: see admission_gate.hpp.
//   open: the accepting thread adds a slot per connection; each
//     connection's I/O thread gives it back; the /api/v1/pools route reads it.
//   lingering: each connection's I/O thread takes a slot when its close
//     starts to linger (kLinger) and gives it back when the socket closes;
//     the /api/v1/pools route reads it.
//   listen_fd, stop_deadline: written by bind() / stop() (main's thread),
//     read by stop() and serve().
//   next_worker, last_accept_warning, acceptor, accept_retry: the accepting
//     thread only (I/O thread 0), after bind().
//   jobs_in_flight: jobs of POST /api/v1/jobs taken and not yet answered
//     (what jobs.max_in_flight bounds); the I/O threads, at a job's
//     admission and answer.
//   downstream: what call jobs GET (jobs.call_url), resolved by the
//     constructor; read-only after (the jobs pool's workers).
//   workers: built by the constructor, then fixed; each IoThread's own
//     fields belong to its thread (io_thread.hpp).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "http/admission_gate.hpp"
#include "http/io_thread.hpp"
#include "http/request.hpp"
#include "http/server.hpp"
#include "jobs/downstream.hpp"

namespace crewd {

// Shared by the server, its I/O threads and the tasks it submits.
struct HttpServer::State : std::enable_shared_from_this<HttpServer::State> {
  State(const Config& c, ServicePools p, std::shared_ptr<spdlog::logger> l,
        std::shared_ptr<RequestMetrics> r, std::vector<std::shared_ptr<prometheus::Collectable>> e)
      : config(c),
        limits{c.http.header_limit, c.http.header_count_limit, c.http.body_limit},
        pools(p),
        log(std::move(l)),
        requests(std::move(r)),
        exposed(std::move(e)) {
    if (const auto url = parse_http_url(c.jobs.call_url)) {
      downstream = resolve_downstream(*url, c.jobs.call_url);
    }
  }

  void accept_next();
  void on_accept(const http::error_code& ec, http::tcp::socket socket, std::size_t worker);
  void close_listener();
  // Why /readyz answers 503 ("halting", or a readiness check's reason);
  // empty when ready. Any thread once serve() runs.
  [[nodiscard]] std::string not_ready_reason() const;

  const Config config;
  const HttpLimits limits;
  ServicePools pools;
  std::shared_ptr<spdlog::logger> log;
  std::shared_ptr<RequestMetrics> requests;
  std::vector<std::shared_ptr<prometheus::Collectable>> exposed;
  std::vector<std::function<std::string()>> readiness_checks;
  std::shared_ptr<ui::Console> console;  // null: the console's routes answer 404
  std::optional<Downstream> downstream;  // none without jobs.call_url
  http::Gate gate;
  std::size_t max_connections = 0;
  // Closes that may linger at once (kLinger): the descriptors left over
  // beside max_connections (HttpServer's constructor). A close past it
  // drops what the client has sent so far and closes at once.
  std::size_t max_lingering = 0;
  // Connections served now (not closing): what max_connections bounds.
  std::atomic<std::size_t> open{0};
  // Connections closing, lingering: what max_lingering bounds.
  std::atomic<std::size_t> lingering{0};
  std::atomic<std::size_t> jobs_in_flight{0};
  std::atomic<int> listen_fd{-1};
  std::atomic<http::Clock::time_point> stop_deadline{http::Clock::time_point::max()};
  std::size_t next_worker = 0;  // worker 0's thread
  http::Clock::time_point last_accept_warning{};

  // Last: destroyed first, while the members above are still there for the
  // connections they destroy.
  std::vector<std::unique_ptr<http::IoThread>> workers;  // the I/O threads
  std::optional<http::tcp::acceptor> acceptor;           // on workers[0]'s io_context
  std::optional<http::net::steady_timer> accept_retry;
};

namespace http {

using State = HttpServer::State;
using namespace std::chrono_literals;

// Bytes asked of the socket per read.
constexpr std::size_t kReadChunk = 8192;
// How often each I/O thread looks at its connections' deadlines: the
// deadlines are this precise.
constexpr auto kSweepInterval = 100ms;
// A connection crewd closes first shuts its sending side and then reads
// (and drops) what the client still sends, for at most this long, before it
// closes the socket: closing with unread bytes would send a reset, which can
// destroy the last response before the client has read it. Each lingering
// close holds a descriptor: State::max_lingering bounds how many there are.
constexpr auto kLinger = 1s;
// Of the time stop() is given, the last part (at most this) is for the
// completions of tasks still running once every connection has been
// closed; past the deadline the I/O threads give up on them (the tasks keep
// the server's state alive; their completions are dropped).
constexpr auto kAbandonSlack = 1s;

inline double millis(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace http
}  // namespace crewd

// service/http/server.hpp: crewd's HTTP/1.1 front door (Boost.Asio, Boost.Beast's
// parser) and the admission rules that make a SIGTERM safe.
//
// A few I/O threads (http.io_threads) serve every connection; each runs an
// io_context of its own, and a connection lives on one of them for its
// whole life, so a connection costs memory and a socket, never a thread: a
// slow, idle or hostile client holds nothing another client needs. Requests
// are read through RequestParser (service/http/request.hpp) under the limits of
// [http]; each phase of a connection has a deadline (waiting for a request,
// its head, its body, writing the response, lingering while it closes).
// Requests that do work go to the "compute" pool (factorials) and the
// "jobs" pool (long tasks with a deadline) through crew::asio: no thread
// waits for them, the connection resumes on its I/O thread when the task
// has an outcome. Pipelined requests are answered in order, one at a time.
// docs/crewd.md lists the routes, status codes and limits.
//
// Stopping (driven by main.cpp, docs/crewd.md "Lifecycle"):
//   halt()             /readyz answers 503; responses say Connection: close.
//   close_admission(receive_by)  the cut: from now on a request for work
//                      (factorial, jobs) gets 503, except the first request
//                      of a connection accepted before the cut; /healthz,
//                      /metrics and /api/v1/pools keep answering. Idle
//                      keep-alive connections are closed at once. A request
//                      still arriving must be complete by `receive_by` (its
//                      head and body deadlines are cut to it: 408).
//   wait_first_requests()  every connection accepted before the cut has had
//                      its first request admitted, and every admitted
//                      request has been handed to its pool (its body read,
//                      its task submitted) or closed without (a half-sent
//                      request is cut at its deadline), so that the pools
//                      stopped after it still take every admitted task.
//   wait_admitted()    every admitted request has its response written.
//   stop(deadline)     closes the listener (new connections are refused) and
//                      idle connections; connections still reading a request
//                      keep their deadlines. Shortly before `deadline` (at
//                      most 1 s) whatever connection is left is closed; at
//                      `deadline` serve() stops waiting for completions of
//                      tasks still running. serve() returns once no
//                      connection and no completion is left.
// Nothing is closed under a request that was admitted, so such a request
// never sees a reset connection.
//
// Lifetimes: the server's state is shared with the tasks it submits, so a
// task that outlives the server (a pool destroyed after it) never touches
// freed memory.
//
// Thread safety: halt(), close_admission(), the waits, stop() and the
// accessors may be called from any thread, concurrently with serve().
// bind() and add_readiness_check() are called before serve().
#pragma once

#include <chrono>
#include <crew/pool.hpp>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "metrics/http_metrics.hpp"

namespace spdlog {
class logger;
}  // namespace spdlog

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace crewd {

namespace ui {
class Console;
}  // namespace ui

struct ServicePools {
  crew::Pool& compute;
  crew::Pool& jobs;
};

class HttpServer {
 public:
  // /metrics serves `exposed` (each collectable's families, in this order);
  // `requests` is told about every response and connection.
  HttpServer(const Config& config, ServicePools pools, std::shared_ptr<spdlog::logger> log,
             std::shared_ptr<RequestMetrics> requests,
             std::vector<std::shared_ptr<prometheus::Collectable>> exposed);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens on config.host:config.port (IPv4 or IPv6); returns
  // the port (the one picked for port 0). Throws std::runtime_error saying
  // why it could not.
  int bind();
  // Runs the I/O threads and accepts connections until stop(); blocks.
  // Returns once every connection has ended and every task submitted for a
  // request has completed (or, past stop()'s deadline, been abandoned).
  void serve();

  void halt() noexcept;
  void close_admission(std::chrono::steady_clock::time_point receive_by) noexcept;
  // Both return false if `deadline` passed or `stop` was requested first.
  [[nodiscard]] bool wait_first_requests(std::chrono::steady_clock::time_point deadline,
                                         std::stop_token stop) const;
  [[nodiscard]] bool wait_admitted(std::chrono::steady_clock::time_point deadline,
                                   std::stop_token stop) const;
  void stop(std::chrono::steady_clock::time_point deadline);
  // /readyz also answers 503 while `check` returns a reason (non-empty),
  // e.g. a lost connection to a dependency. Called before serve(); `check`
  // then runs on the I/O threads, so it must be quick.
  void add_readiness_check(std::function<std::string()> check);
  // Serves the operations console (GET /ui, its snapshot and actions) from
  // `console`; without one those routes answer 404. Called before serve().
  void set_console(std::shared_ptr<ui::Console> console);

  [[nodiscard]] bool halting() const noexcept;
  // Why /readyz answers 503 now ("halting", or a readiness check's reason);
  // empty while it answers 200. Runs the checks on the calling thread.
  [[nodiscard]] std::string not_ready_reason() const;
  // Connections accepted before the cut whose first request is not yet
  // admitted; admitted requests without a written response.
  [[nodiscard]] std::size_t first_requests_pending() const noexcept;
  [[nodiscard]] std::size_t admitted_in_flight() const noexcept;
  // What serve() runs with: I/O threads, and the effective connection limit
  // (http.max_connections, lowered to fit the process's descriptor limit).
  [[nodiscard]] std::size_t io_threads() const noexcept;
  [[nodiscard]] std::size_t max_connections() const noexcept;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace crewd

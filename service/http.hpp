// service/http.hpp: crewd's HTTP front end (cpp-httplib) and the admission
// rules that make a SIGTERM safe.
//
// Every client connection is served by one worker of the "http" pool: the
// cpp-httplib accept loop hands each accepted socket to a crew-backed
// httplib::TaskQueue. Handlers put work on the "compute" pool (factorials,
// short tasks) and the "jobs" pool (long tasks with a deadline) and wait for
// the outcome. docs/crewd.md lists the routes and status codes.
//
// Stopping (driven by main.cpp, docs/crewd.md "Lifecycle"):
//   halt()             /readyz answers 503; responses say Connection: close.
//   close_admission()  the cut: from now on a request for work (factorial,
//                      jobs) gets 503, except the first request of a
//                      connection accepted before the cut; /healthz,
//                      /metrics and /api/v1/pools keep answering.
//   wait_first_requests()  every connection accepted before the cut has had
//                      its first request admitted (or closed without one).
//   wait_admitted()    every admitted request has its response written.
//   stop()             closes the listener (new connections are refused) and
//                      ends idle keep-alive connections; serve() returns once
//                      the http pool has drained.
// Nothing is closed under a request that was admitted, so such a request
// never sees a reset connection.
//
// Thread safety: halt(), close_admission(), the waits, stop() and the
// accessors may be called from any thread, concurrently with serve().
// bind() is called once, before serve().
#pragma once

#include <chrono>
#include <crew/pool.hpp>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <vector>

#include "config.hpp"
#include "http_metrics.hpp"

namespace spdlog {
class logger;
}  // namespace spdlog

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace crewd {

struct ServicePools {
  crew::Pool& http;
  crew::Pool& compute;
  crew::Pool& jobs;
};

class HttpServer {
 public:
  // /metrics serves `exposed` (each collectable's families, in this order);
  // `requests` is told about every response. Both must outlive the server.
  HttpServer(const Config& config, ServicePools pools, std::shared_ptr<spdlog::logger> log,
             RequestMetrics& requests,
             std::vector<std::shared_ptr<prometheus::Collectable>> exposed);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens on config.host:config.port; returns the port (the one
  // picked for port 0). Throws std::runtime_error saying why it could not.
  int bind();
  // Accepts and serves connections until stop(); blocks. Returns once every
  // connection has ended and the http pool has drained.
  void serve();

  void halt() noexcept;
  void close_admission() noexcept;
  // Both return false if `deadline` passed or `stop` was requested first.
  [[nodiscard]] bool wait_first_requests(std::chrono::steady_clock::time_point deadline,
                                         std::stop_token stop) const;
  [[nodiscard]] bool wait_admitted(std::chrono::steady_clock::time_point deadline,
                                   std::stop_token stop) const;
  void stop();
  // /readyz also answers 503 while `check` returns a reason (non-empty),
  // e.g. a lost connection to a dependency. Called before serve();
  // `check` then runs on connection threads.
  void add_readiness_check(std::function<std::string()> check);

  [[nodiscard]] bool halting() const noexcept;
  // Connections accepted before the cut whose first request is not yet
  // admitted; admitted requests without a written response.
  [[nodiscard]] std::size_t first_requests_pending() const noexcept;
  [[nodiscard]] std::size_t admitted_in_flight() const noexcept;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace crewd

// service/http/routes.hpp: crewd's routes, as one table (routes.cpp). Each
// row is a path pattern, the methods it answers and its handler; the path
// match, the dispatch and the `route` label of crewd_http_* metrics (the
// pattern, or "unmatched") all read the table, so adding a route is one row
// and one handler function in routes.cpp:
//
//   {.path = "/api/v1/echo/{word}", .methods = "GET, HEAD", .handler = echo},
//
//   void echo(Exchange& ex) { ex.respond(json_response(200, Json{{"word", ex.arg()}})); }
//
// Patterns (match_path, request.hpp): literal text and at most one "{name}",
// which matches one non-empty path segment; the handler gets it as arg().
//
// Threads: handlers run on the connection's I/O thread, one request at a
// time per connection. A handler that hands work to a pool takes a Reply
// (Exchange::later) and returns; the task's completion, which crew::asio
// runs on the same I/O thread, answers through it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "http/request.hpp"
#include "http/server.hpp"

namespace crewd::http {

using State = HttpServer::State;
class Connection;
class Reply;

// What a handler gets: the request, the server's state, and the one way to
// answer it. A handler calls exactly one of respond() (the answer is ready)
// and later() (a task's completion answers).
class Exchange {
 public:
  [[nodiscard]] virtual const Request& request() const noexcept = 0;
  // The text of the pattern's "{name}" segment; empty without one.
  [[nodiscard]] virtual std::string_view arg() const noexcept = 0;
  [[nodiscard]] virtual State& state() const noexcept = 0;
  // The address the client connected to (the console answers on some only).
  [[nodiscard]] virtual boost::asio::ip::address local_address() const = 0;
  // The connection's I/O thread: where a task's completion must run.
  [[nodiscard]] virtual boost::asio::io_context::executor_type executor() const noexcept = 0;
  virtual void respond(Response r) = 0;
  [[nodiscard]] virtual Reply later() = 0;

 protected:
  Exchange() = default;
  ~Exchange() = default;
  Exchange(const Exchange&) = default;
  Exchange& operator=(const Exchange&) = default;
};

// Answers a request whose handler returned without an answer. Call it on
// the connection's I/O thread (Exchange::executor), at most once; it keeps
// the connection alive until then or until it is destroyed (an answer
// never given leaves the request to the stop's deadlines).
class Reply {
 public:
  explicit Reply(std::shared_ptr<Connection> c) noexcept : c_(std::move(c)) {}
  void operator()(Response r) const;
  [[nodiscard]] State& state() const noexcept;

 private:
  std::shared_ptr<Connection> c_;
};

using Handler = void (*)(Exchange&);

struct Route {
  std::string_view path;     // pattern, and the `route` label of its metrics
  std::string_view methods;  // "GET, HEAD": those answered, and a 405's Allow
  Handler handler = nullptr;
  // The route hands work to a pool: while crewd stops, the admission
  // gate's rules decide whether it starts (admission_gate.hpp).
  bool work = false;
  // For a route that reads a body, called for Expect: 100-continue before
  // the body is sent: a response refuses the request at once, nothing lets
  // the body come (100 Continue). Null: the route reads no body; such a
  // request is answered at once, without it.
  std::optional<Response> (*expect_body)(const State&) = nullptr;
  // For a route that hands work to a pool: called on the I/O thread as soon
  // as the request's head is in, before its body is read or 100 Continue
  // sent, with the head's fields. A response refuses the request (an
  // overloaded pool, a bad header the route reads from the head): it is sent
  // once the body is in, unparsed, and the connection stays open (with
  // Expect: 100-continue it is sent at once and the connection closes).
  std::optional<Response> (*admit_head)(const State&, const Request&) = nullptr;
};

// The table, in the order of the metric labels.
[[nodiscard]] std::span<const Route> routes() noexcept;
// The `route` label values of RequestMetrics: each route's pattern, in
// table order (RequestMetrics adds "unmatched").
[[nodiscard]] std::vector<std::string> route_labels();
// The index of `route` in the table, or routes().size() for none: what
// RequestMetrics::observe takes.
[[nodiscard]] std::size_t route_index(const Route* route) noexcept;

struct RouteMatch {
  const Route* route = nullptr;  // null: no route has this path (404)
  bool method_allowed = false;
  std::string_view arg;
  // Whether the request does work on a pool (what the admission rules gate).
  [[nodiscard]] bool work() const noexcept {
    return route != nullptr && method_allowed && route->work;
  }
};
// The first row whose pattern matches `path`.
[[nodiscard]] RouteMatch match_route(std::string_view method, std::string_view path);

}  // namespace crewd::http

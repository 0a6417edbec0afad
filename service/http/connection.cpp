// A connection's life (service/http/connection.hpp): reading and parsing
// requests, responding, writing, closing, and the deadline of each phase.
// What each route answers is in routes.cpp; on_request hands it the
// request. Runs on the connection's I/O thread only.
#include "http/connection.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <span>
#include <utility>

namespace crewd::http {
namespace {

// Client bytes in a log line: printable, short.
std::string printable(std::string_view s) {
  std::string out;
  for (const char ch : s.substr(0, 128)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  if (s.size() > 128) out += "...";
  return out;
}

}  // namespace

// ---- Connection: reading ----

void Connection::start() {
  error_code ec;
  socket_.non_blocking(true, ec);
  socket_.set_option(tcp::no_delay(true), ec);
  slot_ = Slot::serving;  // its slot in State::open was taken at accept
  s_.requests->connection_opened();
  enter_idle();
  advance();
}

void Connection::enter_idle() {
  phase_ = Phase::idle;
  idle_since_ = Clock::now();
  auto wait = std::chrono::duration_cast<Clock::duration>(s_.config.http.keep_alive_timeout);
  // After the cut a connection is given only the admit grace to start a
  // request: whatever was sent before the signal has arrived by then.
  if (s_.gate.is_cut()) {
    wait = std::min(wait, std::chrono::duration_cast<Clock::duration>(
                              std::max<Clock::duration>(s_.config.shutdown.admit_grace, 10ms)));
  }
  deadline_ = idle_since_ + wait;
}

void Connection::advance() {
  bool full = false;
  const std::size_t served_before = served_;
  for (;;) {
    if (phase_ != Phase::idle && phase_ != Phase::head && phase_ != Phase::body) return;
    if (served_ - served_before >= kPipelineBurst && !in_.empty()) {
      // Pipelined requests answered back to back: let the I/O thread's other
      // connections have their turn before the next ones.
      net::post(w_.ioc, [self = shared_from_this()] { self->advance(); });
      return;
    }
    if (!in_.empty()) {
      const std::size_t before = in_.size();
      const Phase phase = phase_;
      if (parse() == Step::waiting) return;
      if (in_.size() != before || phase_ != phase) {  // progress
        full = false;
        continue;
      }
      if (full) {  // cannot happen with the parser's own limits; never spin
        if (fail_request(431, "request too large", CloseReason::bad_request) == Step::more)
          continue;
        return;
      }
    }
    if (peer_eof_) {
      // Nothing more will come: what is half read is dropped.
      close_now(CloseReason::client);
      return;
    }
    if (input_ != Input::more) {
      wait_readable();  // reads what is there at once, or waits
      return;
    }
    input_ = Input::unknown;
    switch (read_available()) {
      case Read::data:
        continue;
      case Read::full:
        full = true;
        continue;  // parse() reports the limit
      case Read::would_block:
        wait_readable();
        return;
      case Read::eof:
        peer_eof_ = true;
        continue;
      case Read::error:
        close_now(CloseReason::client);
        return;
    }
  }
}

Connection::Read Connection::read_available() {
  const std::size_t cap = read_cap();
  std::size_t got = 0;
  for (;;) {
    const std::span<char> space = in_.prepare(kReadChunk, cap);
    if (space.empty()) return got > 0 ? Read::data : Read::full;
    error_code ec;
    const std::size_t n = socket_.read_some(net::buffer(space.data(), space.size()), ec);
    if (ec == net::error::would_block || ec == net::error::try_again) {
      return got > 0 ? Read::data : Read::would_block;
    }
    if (ec == net::error::eof) {
      if (got > 0) {
        peer_eof_ = true;
        return Read::data;
      }
      return Read::eof;
    }
    if (ec) return got > 0 ? Read::data : Read::error;
    in_.commit(n);
    got += n;
    if (n < space.size()) return Read::data;  // probably all there is; the next read says
  }
}

// Waits for the client's next bytes with an asynchronous read into the
// connection's small landing buffer, not a readiness wait: Asio re-arms
// epoll (an epoll_ctl call) for every readiness wait, but not for a read
// that finds the socket empty; and the landing buffer is small, so that a
// connection waiting for a request holds no read buffer of its own.
void Connection::wait_readable() {
  if (input_ == Input::reading) return;
  input_ = Input::reading;
  landing_[0] = 0;  // see read_landed()
  socket_.async_read_some(
      net::buffer(landing_),
      [self = shared_from_this()](const error_code& ec, std::size_t n) { self->on_read(ec, n); });
}

void Connection::on_read(const error_code& ec, std::size_t n) {
  input_ = Input::unknown;
  if (phase_ == Phase::closed) return;
  if (phase_ == Phase::closing) {
    if (ec) {
      close_now(close_reason_);  // the client closed (or reset): done
    } else {
      drain();
    }
    return;
  }
  if (ec == net::error::eof) {
    peer_eof_ = true;
  } else if (ec && ec != net::error::operation_aborted) {
    close_now(CloseReason::client);
    return;
  }
  if (n > 0) {
    const std::size_t cap = std::max(read_cap(), in_.size() + n);
    const std::span<char> space = in_.prepare(n, cap);
    std::memcpy(space.data(), landing_.data(), n);
    in_.commit(n);
    if (n == landing_.size()) input_ = Input::more;  // there may be more: read it at once
  }
  if (phase_ == Phase::idle || phase_ == Phase::head || phase_ == Phase::body) advance();
}

Connection::Step Connection::parse() {
  const auto now = Clock::now();
  if (!parser_) {
    parser_.emplace(s_.limits);
    current_.head_seen = false;
    current_.refused = false;
    head_refusal_.reset();
    phase_ = Phase::head;
    deadline_ = s_.gate.receive_deadline(now + s_.config.http.head_timeout);
  }
  const std::size_t n = parser_->feed(in_.data());
  in_.consume(n);
  if (parser_->failed()) {
    const RequestError& e = parser_->error();
    return fail_request(e.status, e.message, CloseReason::bad_request);
  }
  if (parser_->header_done() && !current_.head_seen) {
    current_.head_seen = true;
    const Step step = on_head();
    // Answered already (an error, or no body wanted), or waiting.
    if (step == Step::waiting || !parser_) return step;
  }
  if (parser_->done()) return on_request();
  return Step::more;
}

Connection::Step Connection::on_head() {
  const auto now = Clock::now();
  head_at_ = now;
  Request& req = parser_->request();
  req.head_at = now;
  match_ = match_route(req.method, req.path());
  current_.refused = !s_.gate.on_request(gate_.first_pending, gate_.admitted_open,
                                         gate_.handing_over, match_.work());
  if (!parser_->done()) {
    phase_ = Phase::body;
    body_deadline_ = deadline_ = s_.gate.receive_deadline(now + s_.config.http.body_timeout);
  }
  // An overloaded pool refuses from the head, before the body is read or
  // 100 Continue sent: the request costs no parsing and no task.
  const Route* admitting = match_.method_allowed && !current_.refused ? match_.route : nullptr;
  if (admitting != nullptr && admitting->admit_head != nullptr) {
    head_refusal_ = admitting->admit_head(s_, req);
  }
  const bool expect = req.version >= 11;
  if (expect && req.expect_other) {
    return fail_request(417, "only Expect: 100-continue is supported", CloseReason::bad_request);
  }
  if (expect && req.expect_continue && req.has_body && !parser_->done()) {
    const Route* route = match_.method_allowed && !current_.refused ? match_.route : nullptr;
    const bool wants_body = route != nullptr && route->expect_body != nullptr;
    if (wants_body) {
      std::optional<Response> refusal = std::move(head_refusal_);
      head_refusal_.reset();
      if (!refusal) refusal = route->expect_body(s_);
      if (refusal) {
        // Refused before the client sends its body.
        parser_->request().keep_alive = false;
        phase_ = Phase::handling;
        deadline_ = Clock::time_point::max();
        return respond(*std::move(refusal));
      }
    }
    if (!wants_body) {
      // Answer without the body; the client must not send it, so the
      // connection cannot be trusted past this response.
      parser_->request().keep_alive = false;
      return on_request();
    }
    out_ = "HTTP/1.1 100 Continue\r\n\r\n";
    return write_out(After::interim);
  }
  return Step::more;
}

// ---- Connection: handing a request to its route ----

// The Exchange a route's handler gets (routes.hpp): respond() answers at
// once, later() leaves the answer to a Reply.
class Connection::RouteExchange final : public Exchange {
 public:
  explicit RouteExchange(Connection& c) : c_(c) {}

  [[nodiscard]] const Request& request() const noexcept override { return c_.parser_->request(); }
  [[nodiscard]] std::string_view arg() const noexcept override { return c_.match_.arg; }
  [[nodiscard]] State& state() const noexcept override { return c_.s_; }
  [[nodiscard]] net::ip::address local_address() const override {
    error_code ec;
    const auto endpoint = c_.socket_.local_endpoint(ec);
    return ec ? net::ip::address() : endpoint.address();  // unspecified: not loopback
  }
  [[nodiscard]] net::io_context::executor_type executor() const noexcept override {
    return c_.w_.ioc.get_executor();
  }
  void respond(Response r) override { step_ = c_.respond(std::move(r)); }
  [[nodiscard]] Reply later() override {
    deferred_ = true;
    return Reply(c_.shared_from_this());
  }

  // What the connection does next: Step::waiting for a Reply.
  [[nodiscard]] Step step() {
    if (step_) return *step_;
    if (!deferred_)
      return c_.respond(error_response(500, "internal error: the route gave no answer"));
    // The pool has the task (or refused it): nothing left to hand over.
    c_.s_.gate.end_handover(c_.gate_.handing_over);
    return Step::waiting;
  }

 private:
  Connection& c_;
  std::optional<Step> step_;
  bool deferred_ = false;
};

Connection::Step Connection::on_request() {
  phase_ = Phase::handling;
  deadline_ = Clock::time_point::max();
  Request& req = parser_->request();
  current_.head_only = req.method == "HEAD";
  if (req.request_id.empty()) {
    req.request_id = make_request_id();
  } else if (!valid_request_id(req.request_id)) {
    req.request_id.clear();  // not echoed
    return respond(error_response(
        400, "X-Request-Id: 1.." + std::to_string(kMaxRequestId) + " visible ASCII characters"));
  }
  if (current_.refused) return respond(error_response(503, "crewd is shutting down"));
  if (match_.route == nullptr) return respond(error_response(404, "no such route"));
  if (!match_.method_allowed) {
    Response r =
        error_response(405, "method not allowed; allowed: " + std::string(match_.route->methods));
    r.allow = match_.route->methods;
    return respond(std::move(r));
  }
  if (head_refusal_) {
    Response r = *std::move(head_refusal_);
    head_refusal_.reset();
    return respond(std::move(r));
  }
  RouteExchange exchange(*this);
  match_.route->handler(exchange);
  return exchange.step();
}

void Connection::resume(Response r) {
  if (respond(std::move(r)) == Step::more) advance();
}

void Reply::operator()(Response r) const { c_->resume(std::move(r)); }

State& Reply::state() const noexcept { return c_->s_; }

// ---- Connection: responding ----

Connection::Step Connection::fail_request(int status, std::string message, CloseReason why) {
  close_reason_ = why;
  if (!current_.head_seen) {
    match_ = RouteMatch{};
    head_at_ = Clock::now();
  }
  phase_ = Phase::handling;
  deadline_ = Clock::time_point::max();
  current_.head_only = false;
  Response r = error_response(status, message);
  r.close = true;
  return respond(std::move(r));
}

Connection::Step Connection::respond(Response r) {
  if (phase_ == Phase::closed || phase_ == Phase::closing) return Step::waiting;
  s_.gate.end_handover(gate_.handing_over);  // answered: nothing to hand over
  const bool keep = parser_ && !parser_->failed() && parser_->request().keep_alive;
  // A client that shut its sending side after pipelining requests is still
  // answered for those already read: the connection closes after the last.
  const bool nothing_more = peer_eof_ && in_.empty();
  if (!keep || nothing_more || s_.gate.halting() || served_ + 1 >= s_.config.http.keep_alive_max) {
    r.close = true;
  }
  // HTTP/1.0 closes unless the response says otherwise.
  r.keep_alive = !r.close && parser_ && parser_->request().version == 10;
  if (r.close && close_reason_ == CloseReason::client) close_reason_ = CloseReason::server;
  // Counted before it is sent: a client that has read the response finds
  // it counted.
  const auto latency = Clock::now() - head_at_;
  s_.requests->observe(route_index(match_.route), r.status, latency);
  if (s_.log->should_log(spdlog::level::debug)) {
    const Request* req = parser_ ? &parser_->request() : nullptr;
    s_.log->debug("{} {} {} {:.3f} ms", req ? printable(req->method) : "-",
                  req ? printable(req->target) : "-", r.status, millis(latency));
  }
  if (parser_ && !parser_->request().request_id.empty()) {
    r.headers += "X-Request-Id: " + parser_->request().request_id + "\r\n";
  }
  out_.clear();
  append_response(out_, r, current_.head_only);
  ++served_;
  current_.close_after = r.close;
  parser_.reset();
  current_.head_seen = false;
  return write_out(After::response);
}

// ---- Connection: writing ----

Connection::Step Connection::write_out(After after) {
  error_code ec;
  const std::size_t n = socket_.write_some(net::buffer(out_), ec);
  if (!ec && n == out_.size()) return after_write(after);
  if (ec && ec != net::error::would_block && ec != net::error::try_again) {
    close_now(CloseReason::client);
    return Step::waiting;
  }
  const std::size_t done = ec ? 0 : n;
  phase_ = Phase::writing;
  deadline_ = Clock::now() + s_.config.http.write_timeout;
  net::async_write(socket_, net::buffer(out_.data() + done, out_.size() - done),
                   [self = shared_from_this(), after](const error_code& e, std::size_t) {
                     self->on_written(e, after);
                   });
  return Step::waiting;
}

void Connection::on_written(const error_code& ec, After after) {
  if (phase_ == Phase::closed) return;
  if (ec) {
    close_now(CloseReason::client);
    return;
  }
  if (after_write(after) == Step::more) advance();
}

Connection::Step Connection::after_write(After after) {
  if (after == After::interim) {
    phase_ = Phase::body;
    deadline_ = body_deadline_;
    return Step::more;
  }
  s_.gate.on_response_done(gate_.admitted_open);
  if (current_.close_after) {
    if (peer_eof_) {
      close_now(close_reason_);
    } else {
      graceful_close(close_reason_);
    }
    return Step::waiting;
  }
  enter_idle();
  return Step::more;
}

}  // namespace crewd::http

// A connection's end (service/http/connection.hpp): closing gracefully
// (lingering for what the client still sends) or at once, the deadline
// sweep, and the server's cut and stop. Runs on the connection's I/O
// thread only.
#include <boost/asio/post.hpp>
#include <chrono>
#include <string>
#include <string_view>

#include "http/connection.hpp"

namespace crewd::http {

// ---- Connection: closing ----

void Connection::stop_serving(CloseReason why) {
  if (slot_ != Slot::serving) return;
  slot_ = Slot::none;
  s_.open.fetch_sub(1, std::memory_order_relaxed);
  s_.requests->connection_closed(why);
}

void Connection::graceful_close(CloseReason why) {
  if (phase_ == Phase::closing || phase_ == Phase::closed) return;
  stop_serving(why);
  s_.gate.on_close(gate_.first_pending, gate_.admitted_open, gate_.handing_over);
  phase_ = Phase::closing;
  deadline_ = Clock::now() + kLinger;
  parser_.reset();
  in_.clear();
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    close_now(why);
    return;
  }
  if (s_.lingering.fetch_add(1, std::memory_order_relaxed) >= s_.max_lingering) {
    // Every lingering descriptor is taken: drop what has arrived and close
    // now. Only bytes the client sends after this meet a reset.
    s_.lingering.fetch_sub(1, std::memory_order_relaxed);
    w_.note_linger_cut();
    drain(/*linger=*/false);
    return;
  }
  slot_ = Slot::lingering;
  drain();
}

// Reads and drops what the client still sends, until it closes (or the
// linger deadline: the sweep closes the socket then). Without `linger`,
// only what has arrived, then closes. Either way at most kDrainReads reads
// at a time: a client sending as fast as they drain does not hold the I/O
// thread.
void Connection::drain(bool linger) {
  constexpr int kDrainReads = 64;
  char sink[4096];
  for (int i = 0; i < kDrainReads; ++i) {
    error_code ec;
    (void)socket_.read_some(net::buffer(sink), ec);
    if (ec == net::error::would_block || ec == net::error::try_again) break;
    if (ec) {
      close_now(close_reason_);
      return;
    }
  }
  if (linger) {
    wait_readable();
  } else {
    close_now(close_reason_);
  }
}

void Connection::close_now(CloseReason why) {
  if (phase_ == Phase::closed) return;
  stop_serving(why);
  s_.gate.on_close(gate_.first_pending, gate_.admitted_open, gate_.handing_over);
  stop_lingering();
  phase_ = Phase::closed;
  deadline_ = Clock::time_point::max();
  error_code ec;
  socket_.close(ec);  // pending operations end with operation_aborted
  parser_.reset();
  in_.release();
  if (linked_) w_.unlink(this);
}

void Connection::on_deadline(Clock::time_point) {
  switch (phase_) {
    case Phase::idle:
      deadline_ = Clock::time_point::max();  // once
      close_if_idle(s_.gate.is_cut() ? CloseReason::shutdown : CloseReason::idle_timeout);
      return;
    case Phase::head:
      request_timed_out("head", s_.config.http.head_timeout, CloseReason::head_timeout);
      return;
    case Phase::body:
      request_timed_out("body", s_.config.http.body_timeout, CloseReason::body_timeout);
      return;
    case Phase::writing:
      close_now(CloseReason::write_timeout);
      return;
    case Phase::closing:
      close_now(close_reason_);
      return;
    case Phase::handling:
    case Phase::closed:
      return;
  }
}

// 408 for a request whose `part` (head, body) did not arrive within its
// http.<part>_timeout_ms.
void Connection::request_timed_out(std::string_view part, Millis bound, CloseReason why) {
  // Cut short by the stop (receive_deadline): say so rather than the timeout.
  const bool stop = s_.gate.is_cut() && deadline_ == s_.gate.receive_by();
  const std::string message =
      stop ? "the request " + std::string(part) +
                 " did not arrive before crewd stops taking work (shutdown.timeout_ms before "
                 "shutdown.termination_timeout_ms)"
           : "the request " + std::string(part) + " did not arrive within http." +
                 std::string(part) + "_timeout_ms (" + std::to_string(bound.count()) + " ms)";
  if (fail_request(408, message, why) == Step::more) advance();
}

// Closes the connection if it is still idle once the handlers already
// queued on this thread have run: a request that has just arrived may sit
// in a read completion not yet run (the connection still looks idle), or
// in the socket; such a request is served, not cut off.
void Connection::close_if_idle(CloseReason why) {
  net::post(w_.ioc, [self = shared_from_this(), why] {
    if (self->phase_ != Phase::idle || !self->in_.empty() || self->read_landed()) return;
    error_code ec;
    if (self->socket_.available(ec) > 0) return;  // the pending read takes it
    self->graceful_close(why);
  });
}

// Whether the connection is idle with nothing arriving (a candidate to
// close for room).
bool Connection::quiet() const {
  if (phase_ != Phase::idle || !in_.empty() || read_landed()) return false;
  error_code ec;
  return socket_.available(ec) == 0 && !ec;
}

// The cut: a request still arriving gets the stop's receive deadline, and
// idle connections are handled as by stop_idle().
void Connection::on_cut() {
  if (phase_ == Phase::head || phase_ == Phase::body) {
    deadline_ = s_.gate.receive_deadline(deadline_);
    body_deadline_ = s_.gate.receive_deadline(body_deadline_);
    return;
  }
  if (phase_ == Phase::idle) stop_idle();
}

void Connection::on_stop() {
  if (phase_ == Phase::idle) stop_idle();
}

// An idle connection when crewd stops taking work (the cut, the listener's
// close): a keep-alive one is closed at once; one that has not sent a
// request yet gets the admit grace from its accept, since its request may
// be on the way (accepted before the cut, or while the listener closed: its
// handshake was answered before the SYN filter), and gets an answer (503
// for work) rather than a bare close.
void Connection::stop_idle() {
  if (served_ > 0) {
    close_if_idle(CloseReason::shutdown);
    return;
  }
  deadline_ = std::min(deadline_, accepted_ + s_.config.shutdown.admit_grace);
}

// At http.max_connections with nothing idle to close: 503, then close.
void Connection::refuse() {
  error_code ec;
  socket_.non_blocking(true, ec);
  s_.requests->connection_opened();
  slot_ = Slot::serving;
  stop_serving(CloseReason::refused);  // gives its slot back
  Response r = error_response(503, "too many connections (http.max_connections " +
                                       std::to_string(s_.max_connections) + ")");
  r.close = true;
  r.retry_after = 1;
  out_.clear();
  append_response(out_, r, false);
  (void)socket_.write_some(net::buffer(out_), ec);  // best effort: a fresh socket takes it all
  close_reason_ = CloseReason::refused;
  phase_ = Phase::handling;
  graceful_close(CloseReason::refused);
}

}  // namespace crewd::http

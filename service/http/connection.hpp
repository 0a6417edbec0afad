// service/http/connection.hpp: one client connection of crewd's front door:
// reading requests under the [http] limits, the deadline of each phase,
// handing each request to its route, writing the responses in order, and
// closing without resetting what the client has not read yet.
//
// Phases: idle -> head -> body -> handling -> writing -> idle (keep-alive),
// or -> closing (sending side shut, reading what the client still sends,
// for kLinger at most; at once closed instead when State::max_lingering
// closes linger already) -> closed. deadline() is the current phase's; the
// I/O thread's sweep calls on_deadline() when it passes.
//
// Threads: a connection lives on one I/O thread (io_thread.hpp) for its
// whole life, and every member runs there: reads, writes, the sweep, the
// cut and stop (posted to that thread), and the completions of the tasks
// its routes submit (crew::asio resumes them on the thread's executor).
// So nothing here is locked. Asynchronous reads, writes and posted
// closes hold a shared_ptr to the connection, so it lives until the last
// of them has run; a task's completion can run until the task ends or
// the server's stop deadline (serve() then stops the io_context).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "http/in_buffer.hpp"
#include "http/request.hpp"
#include "http/routes.hpp"
#include "http/server_state.hpp"

namespace crewd::http {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(IoThread& w, tcp::socket socket, bool counted)
      : w_(w), s_(w.state), socket_(std::move(socket)), gate_{.first_pending = counted} {
    accepted_ = Clock::now();
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
    stop_lingering();
    if (linked_) w_.unlink(this);
  }

  void start();
  void refuse();
  void on_deadline(Clock::time_point now);
  void on_cut();
  void on_stop();
  void force_close() { close_now(CloseReason::shutdown); }
  void trim() noexcept {
    if (phase_ == Phase::idle && in_.empty()) {
      in_.release();
      std::string().swap(out_);
    }
  }
  [[nodiscard]] Clock::time_point deadline() const noexcept { return deadline_; }
  [[nodiscard]] bool idle() const noexcept { return phase_ == Phase::idle && in_.empty(); }
  [[nodiscard]] bool quiet() const;
  [[nodiscard]] Clock::time_point idle_since() const noexcept { return idle_since_; }
  // Idle with nothing arriving (quiet()): no response to protect, so no
  // linger either; its descriptor is free for the connection that takes
  // its slot.
  void evict() { close_now(CloseReason::evicted); }

  // The next connection in its I/O thread's list (IoThread::first).
  [[nodiscard]] Connection* next() const noexcept { return next_; }

 private:
  // The I/O thread's list is threaded through its connections; only the
  // thread's link() and unlink() change the links.
  friend void IoThread::link(Connection* c) noexcept;
  friend void IoThread::unlink(Connection* c) noexcept;
  Connection* prev_ = nullptr;
  Connection* next_ = nullptr;
  bool linked_ = false;

  enum class Phase : std::uint8_t {
    idle,      // waiting for a request's first byte
    head,      // reading a request's head
    body,      // reading its body
    handling,  // the request is complete; its response is being made
    writing,   // writing (the socket took part of it)
    closing,   // sending side shut; reading what the client still sends
    closed,
  };
  enum class Step : std::uint8_t { more, waiting };
  enum class After : std::uint8_t { response, interim };
  enum class Read : std::uint8_t { data, would_block, full, eof, error };

  void advance();
  Step parse();
  Step on_head();
  Step on_request();
  Step respond(Response r);
  Step write_out(After after);
  Step after_write(After after);
  void on_written(const error_code& ec, After after);
  Read read_available();
  // Pipelined requests one advance() answers before it lets the I/O
  // thread's other connections run: a client that pipelines hundreds of
  // requests (and need not read the responses until its socket buffer is
  // full) delays the others by this many responses, not by all of them.
  static constexpr std::size_t kPipelineBurst = 2;
  void stop_idle();
  void wait_readable();
  void on_read(const error_code& ec, std::size_t n);
  // The most a connection buffers: a head at its limit plus one read.
  [[nodiscard]] std::size_t read_cap() const noexcept {
    return s_.limits.header_bytes + kReadChunk;
  }
  void enter_idle();
  void graceful_close(CloseReason why);
  void drain(bool linger = true);
  // Gives back the State::lingering slot this connection holds, if any.
  void stop_lingering() noexcept {
    if (slot_ != Slot::lingering) return;
    slot_ = Slot::none;
    s_.lingering.fetch_sub(1, std::memory_order_relaxed);
  }
  void close_now(CloseReason why);
  void stop_serving(CloseReason why);
  void close_if_idle(CloseReason why);
  Step fail_request(int status, std::string message, CloseReason why);
  void request_timed_out(std::string_view part, Millis bound, CloseReason why);

  // The route's handler answered later (Reply).
  void resume(Response r);
  friend class Reply;
  class RouteExchange;

  IoThread& w_;
  State& s_;
  tcp::socket socket_;
  Phase phase_ = Phase::idle;
  Clock::time_point accepted_;
  Clock::time_point idle_since_{};
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point body_deadline_{};
  Clock::time_point head_at_{};  // latency is measured from here
  InBuffer in_;
  std::optional<RequestParser> parser_;
  RouteMatch match_;
  std::string out_;
  std::size_t served_ = 0;

  // The state beside phase_. Each group's fields change together, and the
  // comments give their legal combinations.
  //
  // The request being read or answered. Reset when a request's first byte
  // is parsed (parse()); head_seen and close_after also by respond().
  //   head (phase): head_seen = false.   body: head_seen = true.
  //   handling: head_seen, unless the request failed before its head
  //     was read (fail_request: 400, 408, 431); refused only with head_seen.
  //   writing a response: head_seen = false (the next request's head is
  //     not read yet); close_after says whether the connection closes
  //     after it. Writing a 100 Continue: as body.
  struct Current {
    bool head_seen = false;    // on_head() has run for it
    bool head_only = false;    // HEAD: the response goes without its body
    bool refused = false;      // by the gate: it is answered 503
    bool close_after = false;  // the response being written says Connection: close
  };
  Current current_;
  // A refusal decided from the request's head by its route's admit_head
  // (an overloaded pool), answered once the body is in (read, not parsed)
  // so that the connection stays open. Reset with current_.
  std::optional<Response> head_refusal_;
  // Where the next client bytes come from. `reading` is the only state
  // with an asynchronous read pending; `more` is set only by a read that
  // filled landing_, and is cleared before the next read or wait.
  enum class Input : std::uint8_t {
    unknown,  // wait_readable() finds out (reads at once, or waits)
    more,     // the socket may hold more: read before waiting
    reading,  // an asynchronous read is pending (into landing_)
  };
  Input input_ = Input::unknown;
  bool peer_eof_ = false;  // the client shut its sending side (any phase; never reset)
  // Which of State's bounded slots the connection holds: serving from
  // start() (or refuse()) until stop_serving(), lingering from
  // graceful_close() until the socket closes. Never both: a connection
  // stops being served before it lingers.
  enum class Slot : std::uint8_t {
    none,
    serving,    // counted in State::open and the connections gauge
    lingering,  // holds a State::lingering slot (phase closing)
  };
  Slot slot_ = Slot::none;
  // The connection's side of the admission gate (admission_gate.hpp),
  // changed only by the Gate's calls. Legal: first_pending excludes the
  // other two (no request yet); handing_over implies admitted_open.
  struct GateFlags {
    bool first_pending = false;  // counted until its first request (Gate::on_accept)
    bool admitted_open = false;  // an admitted request without a written response
    bool handing_over = false;   // admitted, its task not yet handed to a pool
  };
  GateFlags gate_;
  CloseReason close_reason_ = CloseReason::client;
  std::array<char, 512> landing_;  // where a pending read lands
  // Whether the pending read has taken bytes whose completion has not run
  // yet: the reactor reads on this connection's I/O thread and queues the
  // completion, so until it runs the connection looks idle while a request
  // sits in landing_. wait_readable zeroes the first byte, which no request
  // starts with.
  [[nodiscard]] bool read_landed() const noexcept {
    return input_ == Input::reading && landing_[0] != 0;
  }
};

}  // namespace crewd::http

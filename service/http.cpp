#include "http.hpp"

#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <crew/asio.hpp>
#include <crew/error.hpp>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "job_runner.hpp"
#include "jobs.hpp"
#include "request.hpp"

namespace crewd {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;
using boost::system::error_code;
using namespace std::chrono_literals;

// Bytes asked of the socket per read.
constexpr std::size_t kReadChunk = 8192;
// How often each I/O thread looks at its connections' deadlines: the
// deadlines are this precise.
constexpr auto kSweepInterval = 100ms;
// A connection crewd closes first shuts its sending side and then reads
// (and drops) what the client still sends, for at most this long, before it
// closes the socket: closing with unread bytes would send a reset, which can
// destroy the last response before the client has read it.
constexpr auto kLinger = 1s;
// Of the time stop() is given, the last part (at most this) is for the
// completions of tasks still running once every connection has been
// closed; past the deadline the I/O threads give up on them (the tasks keep
// the server's state alive; their completions are dropped).
constexpr auto kAbandonSlack = 1s;

double millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string dump(const Json& j) {
  // replace: a string holding invalid UTF-8 must not turn into an exception.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Response json_response(int status, const Json& body) {
  Response r;
  r.status = status;
  r.body = dump(body);
  return r;
}

// Client bytes in a log line: printable, short.
std::string printable(std::string_view s) {
  std::string out;
  for (const char ch : s.substr(0, 128)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  if (s.size() > 128) out += "...";
  return out;
}

// Which requests still start work while crewd stops. The counters are
// sequentially consistent so that the cut (main's thread) and an admission
// (an I/O thread) cannot miss each other: each side writes its own
// variable, then reads the other's. The per-connection flags are touched
// only by the connection's I/O thread.
class Gate {
 public:
  // Whether the connection is counted until its first request.
  bool on_accept() noexcept {
    first_pending_.fetch_add(1);
    if (cut_.load()) {
      first_pending_.fetch_sub(1);
      return false;
    }
    return true;
  }

  // A request's head arrived; `work` says whether it would start work.
  // Returns whether it may. The first request of a connection accepted
  // before the cut is always admitted: the client sent it before it could know.
  bool on_request(bool& counted, bool& admitted_open, bool work) noexcept {
    const bool first = counted;
    if (work) admitted_open_.fetch_add(1);  // before the first is uncounted
    if (first) {
      counted = false;
      first_pending_.fetch_sub(1);
    }
    if (!work) return true;
    if (!first && cut_.load()) {
      admitted_open_.fetch_sub(1);
      return false;
    }
    admitted_open = true;
    return true;
  }

  void on_response_done(bool& admitted_open) noexcept {
    if (admitted_open) {
      admitted_open = false;
      admitted_open_.fetch_sub(1);
    }
  }

  void on_close(bool& counted, bool& admitted_open) noexcept {
    if (counted) {
      counted = false;
      first_pending_.fetch_sub(1);
    }
    on_response_done(admitted_open);
  }

  void halt() noexcept { halting_.store(true); }
  void cut() noexcept { cut_.store(true); }
  [[nodiscard]] bool halting() const noexcept { return halting_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool is_cut() const noexcept { return cut_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t first_pending() const noexcept { return first_pending_.load(); }
  [[nodiscard]] std::size_t admitted_open() const noexcept { return admitted_open_.load(); }

 private:
  std::atomic<bool> halting_{false};
  std::atomic<bool> cut_{false};
  std::atomic<std::size_t> first_pending_{0};
  std::atomic<std::size_t> admitted_open_{0};
};

// Polls: the waits run once, during a shutdown, and a few milliseconds of
// latency there cost nothing, whereas a notification would cost every
// request a check.
bool poll_until(const std::function<bool()>& done, Clock::time_point deadline,
                const std::stop_token& stop) {
  while (!done()) {
    if (Clock::now() >= deadline || stop.stop_requested()) return done();
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// What a connection has received and not yet parsed. Allocated while
// needed; an idle connection holds none (released by the sweep).
class InBuffer {
 public:
  [[nodiscard]] std::string_view data() const noexcept {
    return {buf_.get() + begin_, end_ - begin_};
  }
  [[nodiscard]] bool empty() const noexcept { return begin_ == end_; }
  [[nodiscard]] std::size_t size() const noexcept { return end_ - begin_; }
  void consume(std::size_t n) noexcept {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
  }
  void clear() noexcept { begin_ = end_ = 0; }
  // Room for up to `want` more bytes with at most `cap` held in all; empty
  // when `cap` is reached.
  std::span<char> prepare(std::size_t want, std::size_t cap) {
    const std::size_t have = size();
    if (have >= cap) return {};
    want = std::min(want, cap - have);
    if (cap_ - end_ < want) {
      if (cap_ - have >= want) {
        std::memmove(buf_.get(), buf_.get() + begin_, have);
      } else {
        const std::size_t size = std::min(std::max(have + want, cap_ * 2), cap);
        auto fresh = std::make_unique_for_overwrite<char[]>(size);
        if (have > 0) std::memcpy(fresh.get(), buf_.get() + begin_, have);
        buf_ = std::move(fresh);
        cap_ = size;
      }
      begin_ = 0;
      end_ = have;
    }
    return {buf_.get() + end_, want};
  }
  void commit(std::size_t n) noexcept { end_ += n; }
  void release() noexcept {
    if (empty()) {
      buf_.reset();
      cap_ = begin_ = end_ = 0;
    }
  }

 private:
  std::unique_ptr<char[]> buf_;
  std::size_t cap_ = 0;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
};

// A job's clock and id, shared between the task (which may end without a
// value: timed out, cancelled) and the handler.
struct JobTimes {
  std::atomic<std::int64_t> started_ns{0};
  std::atomic<std::int64_t> ended_ns{0};
  std::atomic<std::uint64_t> id{0};
};

class Connection;
struct Worker;
Response factorial_response(unsigned n, std::uint64_t value);

}  // namespace

// Shared by the server, its I/O threads and the tasks it submits.
struct HttpServer::State : std::enable_shared_from_this<HttpServer::State> {
  State(const Config& c, ServicePools p, std::shared_ptr<spdlog::logger> l,
        std::shared_ptr<RequestMetrics> r, std::vector<std::shared_ptr<prometheus::Collectable>> e)
      : config(c),
        limits{c.http.header_limit, c.http.header_count_limit, c.http.body_limit},
        pools(p),
        log(std::move(l)),
        requests(std::move(r)),
        exposed(std::move(e)) {}

  void accept_next();
  void on_accept(const error_code& ec, tcp::socket socket, std::size_t worker);
  void close_listener();
  Response pools_json() const;
  Response metrics_text() const;
  Response readiness() const;

  const Config config;
  const HttpLimits limits;
  ServicePools pools;
  std::shared_ptr<spdlog::logger> log;
  std::shared_ptr<RequestMetrics> requests;
  std::vector<std::shared_ptr<prometheus::Collectable>> exposed;
  std::vector<std::function<std::string()>> readiness_checks;
  Gate gate;
  std::size_t max_connections = 0;
  // Connections served now (not closing): what max_connections bounds.
  std::atomic<std::size_t> open{0};
  std::atomic<int> listen_fd{-1};
  std::atomic<Clock::time_point> stop_deadline{Clock::time_point::max()};
  std::size_t next_worker = 0;  // worker 0's thread
  Clock::time_point last_accept_warning{};

  // Last: destroyed first, while the members above are still there for the
  // connections they destroy.
  std::vector<std::unique_ptr<Worker>> workers;
  std::optional<tcp::acceptor> acceptor;  // on workers[0]'s io_context
  std::optional<net::steady_timer> accept_retry;
};

namespace {

using State = HttpServer::State;

// One I/O thread: its io_context and the connections it serves.
struct Worker {
  Worker(State& s, std::size_t i) : state(s), index(i) {}

  void adopt(tcp::socket socket, bool counted, bool over);
  void sweep();
  void arm_sweep();
  void cut();
  void begin_stop(Clock::time_point force_at);
  bool evict_one();
  void link(Connection* c) noexcept;
  void unlink(Connection* c) noexcept;

  State& state;
  const std::size_t index;
  // This thread's connections (a list threaded through them).
  Connection* first = nullptr;
  std::size_t count = 0;
  bool stopping = false;
  Clock::time_point force_close_at = Clock::time_point::max();
  bool forced = false;
  bool sweeping = false;          // the sweep timer is armed
  std::atomic<bool> done{false};  // run() returned

  net::io_context ioc{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work{ioc.get_executor()};
  net::steady_timer sweep_timer{ioc};
  std::thread thread;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Worker& w, tcp::socket socket, bool counted)
      : w_(w), s_(w.state), socket_(std::move(socket)), counted_(counted) {
    accepted_ = Clock::now();
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
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
  void evict() { graceful_close(CloseReason::evicted); }

  Connection* prev = nullptr;
  Connection* next = nullptr;
  bool linked_ = false;

 private:
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
  void wait_readable();
  void on_read(const error_code& ec, std::size_t n);
  // The most a connection buffers: a head at its limit plus one read.
  [[nodiscard]] std::size_t read_cap() const noexcept {
    return s_.limits.header_bytes + kReadChunk;
  }
  void enter_idle();
  void graceful_close(CloseReason why);
  void drain();
  void close_now(CloseReason why);
  void stop_serving(CloseReason why);
  void close_if_idle(CloseReason why);
  Step fail_request(int status, std::string message, CloseReason why);

  Step factorial(std::string_view arg);
  void on_factorial(unsigned n, std::exception_ptr e, std::uint64_t value);
  Step job();
  void on_job(const JobRequest& job, const std::shared_ptr<JobTimes>& times,
              Clock::time_point submitted, std::exception_ptr e);
  void resume(Response r);

  Worker& w_;
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
  bool head_seen_ = false;
  bool head_only_ = false;
  bool refused_ = false;       // by the gate: 503
  bool close_after_ = false;   // the response being written says Connection: close
  bool peer_eof_ = false;      // the client shut its sending side
  bool waiting_read_ = false;  // an asynchronous read is pending (into landing_)
  bool more_ = false;          // the socket may hold more: read before waiting
  bool open_ = false;          // counted in State::open and the connections gauge
  bool counted_;               // Gate: first request pending
  bool admitted_open_ = false;
  CloseReason close_reason_ = CloseReason::client;
  std::array<char, 512> landing_;  // where a pending read lands
};

// ---- Worker ----

void Worker::link(Connection* c) noexcept {
  c->next = first;
  c->prev = nullptr;
  if (first != nullptr) first->prev = c;
  first = c;
  c->linked_ = true;
  ++count;
}

void Worker::unlink(Connection* c) noexcept {
  if (c->prev != nullptr) c->prev->next = c->next;
  if (c->next != nullptr) c->next->prev = c->prev;
  if (first == c) first = c->next;
  c->prev = c->next = nullptr;
  c->linked_ = false;
  --count;
}

// `over`: the connection took a slot past http.max_connections (State::open
// counts it already): the oldest idle connection of this thread gives its
// slot up, or the new one is refused.
void Worker::adopt(tcp::socket socket, bool counted, bool over) {
  const bool refuse = over && !evict_one();
  auto c = std::make_shared<Connection>(*this, std::move(socket), counted);
  link(c.get());
  arm_sweep();  // it may have stopped: stopping, with no connection left
  if (refuse) {
    c->refuse();
    return;
  }
  c->start();
}

// The oldest idle connection of this thread makes room for a new one (one
// whose request is arriving this instant is passed over).
bool Worker::evict_one() {
  Connection* skip[3] = {nullptr, nullptr, nullptr};
  for (Connection*& passed : skip) {
    Connection* oldest = nullptr;
    for (Connection* c = first; c != nullptr; c = c->next) {
      if (!c->idle() || std::find(std::begin(skip), std::end(skip), c) != std::end(skip)) continue;
      if (oldest == nullptr || c->idle_since() < oldest->idle_since()) oldest = c;
    }
    if (oldest == nullptr) return false;
    if (oldest->quiet()) {
      oldest->evict();
      return true;
    }
    passed = oldest;
  }
  return false;
}

void Worker::arm_sweep() {
  if (sweeping) return;
  sweeping = true;
  sweep_timer.expires_after(kSweepInterval);
  sweep_timer.async_wait([this](const error_code& ec) {
    sweeping = false;
    if (!ec) sweep();
  });
}

void Worker::sweep() {
  const auto now = Clock::now();
  if (stopping && now >= force_close_at && !forced) {
    forced = true;
    std::size_t cut = 0;
    for (Connection* c = first; c != nullptr;) {
      Connection* next = c->next;  // c unlinks itself
      c->force_close();
      ++cut;
      c = next;
    }
    if (cut > 0) state.log->warn("stop deadline: closed {} connections still open", cut);
  }
  for (Connection* c = first; c != nullptr;) {
    Connection* next = c->next;  // c may unlink itself
    if (c->deadline() <= now) {
      c->on_deadline(now);
    } else {
      c->trim();
    }
    c = next;
  }
  // Stopping with no connection left: no more sweeps, so that run()
  // returns once the last task's completion has run.
  if (stopping && count == 0) return;
  arm_sweep();
}

void Worker::cut() {
  for (Connection* c = first; c != nullptr;) {
    Connection* next = c->next;
    c->on_cut();
    c = next;
  }
}

void Worker::begin_stop(Clock::time_point force_at) {
  stopping = true;
  force_close_at = force_at;
  work.reset();
  for (Connection* c = first; c != nullptr;) {
    Connection* next = c->next;
    c->on_stop();
    c = next;
  }
}

// ---- Connection: reading ----

void Connection::start() {
  error_code ec;
  socket_.non_blocking(true, ec);
  socket_.set_option(tcp::no_delay(true), ec);
  open_ = true;  // its slot in State::open was taken at accept
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
  for (;;) {
    if (phase_ != Phase::idle && phase_ != Phase::head && phase_ != Phase::body) return;
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
    if (!more_) {
      wait_readable();  // reads what is there at once, or waits
      return;
    }
    more_ = false;
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
  if (waiting_read_) return;
  waiting_read_ = true;
  socket_.async_read_some(
      net::buffer(landing_),
      [self = shared_from_this()](const error_code& ec, std::size_t n) { self->on_read(ec, n); });
}

void Connection::on_read(const error_code& ec, std::size_t n) {
  waiting_read_ = false;
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
    more_ = n == landing_.size();  // there may be more: read it at once
  }
  if (phase_ == Phase::idle || phase_ == Phase::head || phase_ == Phase::body) advance();
}

Connection::Step Connection::parse() {
  const auto now = Clock::now();
  if (!parser_) {
    parser_.emplace(s_.limits);
    head_seen_ = false;
    refused_ = false;
    phase_ = Phase::head;
    deadline_ = now + s_.config.http.head_timeout;
  }
  const std::size_t n = parser_->feed(in_.data());
  in_.consume(n);
  if (parser_->failed()) {
    const RequestError& e = parser_->error();
    return fail_request(e.status, e.message, CloseReason::bad_request);
  }
  if (parser_->header_done() && !head_seen_) {
    head_seen_ = true;
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
  match_ = match_route(req.method, req.path());
  const bool work = match_.route != Route::unmatched && match_.method_allowed && match_.work();
  refused_ = !s_.gate.on_request(counted_, admitted_open_, work);
  if (!parser_->done()) {
    phase_ = Phase::body;
    body_deadline_ = deadline_ = now + s_.config.http.body_timeout;
  }
  const bool expect = req.version >= 11;
  if (expect && req.expect_other) {
    return fail_request(417, "only Expect: 100-continue is supported", CloseReason::bad_request);
  }
  if (expect && req.expect_continue && req.has_body && !parser_->done()) {
    const bool wants_body = match_.route == Route::jobs && match_.method_allowed && !refused_;
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

// ---- Connection: requests ----

Connection::Step Connection::on_request() {
  phase_ = Phase::handling;
  deadline_ = Clock::time_point::max();
  const Request& req = parser_->request();
  head_only_ = req.method == "HEAD";
  if (refused_) return respond(error_response(503, "crewd is shutting down"));
  if (match_.route == Route::unmatched) return respond(error_response(404, "no such route"));
  if (!match_.method_allowed) {
    Response r = error_response(405, std::string("method not allowed; allowed: ") + match_.allow);
    r.allow = match_.allow;
    return respond(std::move(r));
  }
  switch (match_.route) {
    case Route::factorial:
      return factorial(match_.arg);
    case Route::jobs:
      return job();
    case Route::pools:
      return respond(s_.pools_json());
    case Route::metrics:
      return respond(s_.metrics_text());
    case Route::healthz:
      return respond(json_response(200, Json{{"status", "ok"}}));
    case Route::readyz:
      return respond(s_.readiness());
    case Route::unmatched:
      break;
  }
  return respond(error_response(404, "no such route"));
}

Connection::Step Connection::fail_request(int status, std::string message, CloseReason why) {
  close_reason_ = why;
  if (!head_seen_) {
    match_ = RouteMatch{};
    head_at_ = Clock::now();
  }
  phase_ = Phase::handling;
  deadline_ = Clock::time_point::max();
  head_only_ = false;
  Response r = error_response(status, message);
  r.close = true;
  return respond(std::move(r));
}

Connection::Step Connection::respond(Response r) {
  if (phase_ == Phase::closed || phase_ == Phase::closing) return Step::waiting;
  const bool keep = parser_ && !parser_->failed() && parser_->request().keep_alive;
  if (!keep || peer_eof_ || s_.gate.halting() || served_ + 1 >= s_.config.http.keep_alive_max) {
    r.close = true;
  }
  // HTTP/1.0 closes unless the response says otherwise.
  r.keep_alive = !r.close && parser_ && parser_->request().version == 10;
  if (r.close && close_reason_ == CloseReason::client) close_reason_ = CloseReason::server;
  // Counted before it is sent: a client that has read the response finds
  // it counted.
  const auto latency = Clock::now() - head_at_;
  s_.requests->observe(match_.route, r.status, latency);
  if (s_.log->should_log(spdlog::level::debug)) {
    const Request* req = parser_ ? &parser_->request() : nullptr;
    s_.log->debug("{} {} {} {:.3f} ms", req ? printable(req->method) : "-",
                  req ? printable(req->target) : "-", r.status, millis(latency));
  }
  out_.clear();
  append_response(out_, r, head_only_);
  ++served_;
  close_after_ = r.close;
  parser_.reset();
  head_seen_ = false;
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
  s_.gate.on_response_done(admitted_open_);
  if (close_after_) {
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

// ---- Connection: closing ----

void Connection::stop_serving(CloseReason why) {
  if (!open_) return;
  open_ = false;
  s_.open.fetch_sub(1, std::memory_order_relaxed);
  s_.requests->connection_closed(why);
}

void Connection::graceful_close(CloseReason why) {
  if (phase_ == Phase::closing || phase_ == Phase::closed) return;
  stop_serving(why);
  s_.gate.on_close(counted_, admitted_open_);
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
  drain();
}

// Reads and drops what the client still sends, until it closes (or the
// linger deadline: the sweep closes the socket then).
void Connection::drain() {
  char sink[4096];
  for (;;) {
    error_code ec;
    (void)socket_.read_some(net::buffer(sink), ec);
    if (ec == net::error::would_block || ec == net::error::try_again) {
      wait_readable();
      return;
    }
    if (ec) {
      close_now(close_reason_);
      return;
    }
  }
}

void Connection::close_now(CloseReason why) {
  if (phase_ == Phase::closed) return;
  stop_serving(why);
  s_.gate.on_close(counted_, admitted_open_);
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
      if (fail_request(408,
                       "the request head did not arrive within http.head_timeout_ms (" +
                           std::to_string(s_.config.http.head_timeout.count()) + " ms)",
                       CloseReason::head_timeout) == Step::more) {
        advance();
      }
      return;
    case Phase::body:
      if (fail_request(408,
                       "the request body did not arrive within http.body_timeout_ms (" +
                           std::to_string(s_.config.http.body_timeout.count()) + " ms)",
                       CloseReason::body_timeout) == Step::more) {
        advance();
      }
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

// Closes the connection if it is still idle once the handlers already
// queued on this thread have run: a request that has just arrived may sit
// in a read completion not yet run (the connection still looks idle), or
// in the socket; such a request is served, not cut off.
void Connection::close_if_idle(CloseReason why) {
  net::post(w_.ioc, [self = shared_from_this(), why] {
    if (self->phase_ != Phase::idle || !self->in_.empty()) return;
    error_code ec;
    if (self->socket_.available(ec) > 0) return;  // the pending read takes it
    self->graceful_close(why);
  });
}

// Whether the connection is idle with nothing arriving (a candidate to
// close for room).
bool Connection::quiet() const {
  if (phase_ != Phase::idle || !in_.empty()) return false;
  error_code ec;
  return socket_.available(ec) == 0 && !ec;
}

// The cut: idle keep-alive connections are closed at once; one that has
// not sent a byte yet gets the admit grace from its accept.
void Connection::on_cut() {
  if (phase_ != Phase::idle) return;
  if (served_ > 0) {
    close_if_idle(CloseReason::shutdown);
    return;
  }
  deadline_ = std::min(deadline_, accepted_ + s_.config.shutdown.admit_grace);
}

void Connection::on_stop() {
  if (phase_ == Phase::idle) close_if_idle(CloseReason::shutdown);
}

// At http.max_connections with nothing idle to close: 503, then close.
void Connection::refuse() {
  error_code ec;
  socket_.non_blocking(true, ec);
  s_.requests->connection_opened();
  open_ = true;
  stop_serving(CloseReason::refused);  // gives its slot back
  Response r = error_response(503, "too many connections (http.max_connections " +
                                       std::to_string(s_.max_connections) + ")");
  r.close = true;
  r.retry_after = true;
  out_.clear();
  append_response(out_, r, false);
  (void)socket_.write_some(net::buffer(out_), ec);  // best effort: a fresh socket takes it all
  close_reason_ = CloseReason::refused;
  phase_ = Phase::handling;
  graceful_close(CloseReason::refused);
}

// ---- Connection: routes that do work ----

Connection::Step Connection::factorial(std::string_view arg) {
  const auto parsed = parse_factorial_n(arg);
  if (const auto* e = std::get_if<ParseError>(&parsed))
    return respond(error_response(400, e->message));
  const unsigned n = std::get<unsigned>(parsed);
  if (s_.config.compute.inline_factorial)
    return respond(factorial_response(n, crewd::factorial(n)));
  crew::asio::async_try_submit(
      s_.pools.compute, w_.ioc.get_executor(),
      [n, keep = s_.shared_from_this()] { return crewd::factorial(n); },
      {.name = "factorial", .queue_timeout = s_.config.compute.queue_timeout},
      [self = shared_from_this(), n](std::exception_ptr e, std::uint64_t value) {
        self->on_factorial(n, std::move(e), value);
      });
  return Step::waiting;
}

void Connection::resume(Response r) {
  if (respond(std::move(r)) == Step::more) advance();
}

void Connection::on_factorial(unsigned n, std::exception_ptr e, std::uint64_t value) {
  if (e) {
    std::string message = "pool compute did not run the task";
    try {
      std::rethrow_exception(e);
    } catch (const crew::Error& err) {
      if (err.code() == crew::Errc::rejected) {
        message =
            "pool compute refused the task (" + std::string(crew::to_string(err.admission())) + ")";
      } else {
        message += " (" + std::string(crew::to_string(err.code())) + ")";
      }
    } catch (const std::exception& err) {
      s_.log->error("factorial {}: {}", n, err.what());
      resume(error_response(500, "internal error"));
      return;
    }
    resume(error_response(503, message));
    return;
  }
  resume(factorial_response(n, value));
}

// By hand: this is the route the throughput figures measure.
Response factorial_response(unsigned n, std::uint64_t value) {
  Response r;
  char buf[64] = "{\"n\":";
  char* p = buf + 5;
  p = std::to_chars(p, buf + sizeof(buf), n).ptr;
  constexpr std::string_view kResult = ",\"result\":";
  p = std::copy(kResult.begin(), kResult.end(), p);
  p = std::to_chars(p, buf + sizeof(buf), value).ptr;
  *p++ = '}';
  r.body.assign(buf, static_cast<std::size_t>(p - buf));
  return r;
}

Connection::Step Connection::job() {
  const auto parsed = parse_job_request(parser_->request().body, s_.config.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&parsed))
    return respond(error_response(400, e->message));
  const JobRequest job = std::get<JobRequest>(parsed);
  auto times = std::make_shared<JobTimes>();
  const auto submitted = Clock::now();
  crew::asio::async_try_submit(
      s_.pools.jobs, w_.ioc.get_executor(),
      [job, times, keep = s_.shared_from_this()](const crew::TaskContext& ctx) {
        times->id.store(ctx.id);
        times->started_ns.store(now_ns());
        (void)run_job_until(job, Clock::now() + std::chrono::milliseconds(job.ms), ctx.stop_token);
        times->ended_ns.store(now_ns());
      },
      {.name = job.name,
       .timeout = std::chrono::milliseconds(job.timeout_ms),
       .queue_timeout = s_.config.jobs.queue_timeout},
      [self = shared_from_this(), job, times, submitted](std::exception_ptr e) {
        self->on_job(job, times, submitted, std::move(e));
      });
  return Step::waiting;
}

void Connection::on_job(const JobRequest& job, const std::shared_ptr<JobTimes>& times,
                        Clock::time_point submitted, std::exception_ptr e) {
  std::string outcome = "succeeded";
  int code = 200;
  std::string message;
  std::optional<crew::Errc> reason;
  bool retry_after = false;
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const crew::Error& err) {
      reason = err.code();
      switch (err.code()) {
        case crew::Errc::timed_out:
        case crew::Errc::abandoned:
          outcome = "timed_out";
          code = 504;
          message = "the task ran past its deadline";
          break;
        case crew::Errc::cancelled:
          outcome = "cancelled";
          code = 503;
          message = "the task was cancelled (cancelled): crewd is shutting down";
          break;
        case crew::Errc::rejected:
          outcome = "rejected";
          code = 503;
          message =
              "pool jobs refused the task (" + std::string(crew::to_string(err.admission())) + ")";
          retry_after = true;
          break;
        default:  // shutdown_dropped, expired
          outcome = "rejected";
          code = 503;
          message =
              "pool jobs did not run the task (" + std::string(crew::to_string(err.code())) + ")";
          break;
      }
    } catch (const std::exception& err) {
      outcome = "failed";
      code = 500;
      message = "the task failed";
      s_.log->error("job {}: {}", job.name, err.what());
    }
  }
  Json body{{"name", job.name},
            {"kind", std::string(to_string(job.kind))},
            {"ms", job.ms},
            {"timeout_ms", job.timeout_ms},
            {"task_id", times->id.load()},
            {"outcome", outcome}};
  const std::int64_t started = times->started_ns.load();
  const std::int64_t ended = times->ended_ns.load();
  const std::int64_t submitted_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(submitted.time_since_epoch()).count();
  if (started != 0) {
    body["queue_ms"] = static_cast<double>(started - submitted_ns) / 1e6;
    if (ended != 0) body["run_ms"] = static_cast<double>(ended - started) / 1e6;
  }
  body["total_ms"] = millis(Clock::now() - submitted);
  if (code != 200) {
    body["error"] = message;
    body["reason"] = reason ? std::string(crew::to_string(*reason)) : "failed";
    body["status"] = code;
  }
  Response r = json_response(code, body);
  r.retry_after = retry_after;
  resume(std::move(r));
}

}  // namespace

// ---- State ----

void State::accept_next() {
  if (!acceptor || !acceptor->is_open()) return;
  const std::size_t i = next_worker++ % workers.size();
  acceptor->async_accept(workers[i]->ioc, [this, i](const error_code& ec, tcp::socket socket) {
    on_accept(ec, std::move(socket), i);
  });
}

void State::on_accept(const error_code& ec, tcp::socket socket, std::size_t worker) {
  if (!acceptor || !acceptor->is_open()) return;  // closed: stop()
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    // Out of descriptors or memory: the pending connections wait in the
    // kernel's queue; try again shortly instead of spinning.
    const bool exhausted = ec == net::error::no_descriptors || ec.value() == ENFILE ||
                           ec == net::error::no_buffer_space || ec == net::error::no_memory;
    const auto now = Clock::now();
    if (now - last_accept_warning > 10s) {
      last_accept_warning = now;
      log->warn("accept: {} ({} connections open)", ec.message(), open.load());
    }
    if (exhausted) {
      accept_retry->expires_after(100ms);
      accept_retry->async_wait([this](const error_code& e) {
        if (!e) accept_next();
      });
      return;
    }
    accept_next();
    return;
  }
  const bool counted = gate.on_accept();
  // The connection's slot, taken here (one thread accepts), so that a burst
  // of accepts cannot pass the limit before their connections start.
  const bool over = open.fetch_add(1, std::memory_order_relaxed) >= max_connections;
  net::post(workers[worker]->ioc, [w = workers[worker].get(), s = std::move(socket), counted,
                                   over]() mutable { w->adopt(std::move(s), counted, over); });
  accept_next();
}

void State::close_listener() {
  if (acceptor && acceptor->is_open()) {
    error_code ec;
    acceptor->close(ec);
  }
  if (accept_retry) accept_retry->cancel();
}

Response State::pools_json() const {
  Json list = Json::array();
  for (const crew::Pool* p : {&pools.compute, &pools.jobs}) {
    const crew::PoolStats s = p->stats();
    Json worker_list = Json::array();
    for (const crew::WorkerInfo& w : p->workers()) {
      Json worker{{"id", w.id},
                  {"state", std::string(crew::to_string(w.state))},
                  {"running_ms", millis(w.running_for)}};
      if (w.task.id != 0 || !w.task.name.empty()) {
        worker["task"] = Json{{"id", w.task.id}, {"name", w.task.name}};
      }
      worker_list.push_back(std::move(worker));
    }
    list.push_back(Json{{"name", std::string(p->name())},
                        {"state", std::string(crew::to_string(s.state))},
                        {"workers", s.workers},
                        {"idle", s.idle},
                        {"busy", s.busy},
                        {"max_workers", s.max_workers},
                        {"queued", s.queued},
                        {"blocked_submitters", s.blocked_submitters},
                        {"submitted", s.submitted},
                        {"outcomes",
                         {{"succeeded", s.outcomes.succeeded},
                          {"failed", s.outcomes.failed},
                          {"cancelled", s.outcomes.cancelled},
                          {"timed_out", s.outcomes.timed_out},
                          {"rejected", s.outcomes.rejected}}},
                        {"abandoned", s.abandoned},
                        {"workers_replaced", s.workers_replaced},
                        {"helped", s.helped},
                        {"worker_list", std::move(worker_list)}});
  }
  const Json http{{"io_threads", workers.size()},
                  {"connections", open.load(std::memory_order_relaxed)},
                  {"max_connections", max_connections}};
  return json_response(
      200, Json{{"halting", gate.halting()}, {"http", http}, {"pools", std::move(list)}});
}

Response State::metrics_text() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : exposed) {
    auto f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  Response r;
  r.body = prometheus::TextSerializer().Serialize(families);
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  return r;
}

Response State::readiness() const {
  if (gate.halting()) return json_response(503, Json{{"status", "halting"}});
  for (const auto& check : readiness_checks) {
    if (std::string why = check(); !why.empty()) {
      return json_response(503, Json{{"status", "not ready"}, {"reason", why}});
    }
  }
  return json_response(200, Json{{"status", "ready"}});
}

// ---- HttpServer ----

HttpServer::HttpServer(const Config& config, ServicePools pools,
                       std::shared_ptr<spdlog::logger> log,
                       std::shared_ptr<RequestMetrics> requests,
                       std::vector<std::shared_ptr<prometheus::Collectable>> exposed)
    : state_(std::make_shared<State>(config, pools, std::move(log), std::move(requests),
                                     std::move(exposed))) {
  std::size_t threads = config.http.io_threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t i = 0; i < threads; ++i) {
    state_->workers.push_back(std::make_unique<Worker>(*state_, i));
  }
  // Every connection is a descriptor: the limit fits what the process may
  // open (raised to its hard limit), with room for everything else.
  rlimit nofile{};
  std::size_t limit = config.http.max_connections;
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    if (nofile.rlim_cur < nofile.rlim_max) {
      rlimit raised = nofile;
      raised.rlim_cur = nofile.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) nofile = raised;
    }
    constexpr rlim_t kReserve = 128;  // log, /proc reads, Redis, pools' eventfds...
    if (nofile.rlim_cur != RLIM_INFINITY) {
      const auto fit = static_cast<std::size_t>(
          nofile.rlim_cur > 2 * kReserve ? nofile.rlim_cur - kReserve : nofile.rlim_cur / 2);
      if (fit < limit) {
        state_->log->warn(
            "http.max_connections {} lowered to {}: the process may open {} descriptors "
            "(ulimit -n)",
            limit, fit, static_cast<std::uint64_t>(nofile.rlim_cur));
        limit = fit;
      }
    }
  }
  state_->max_connections = std::max<std::size_t>(limit, 1);
}

HttpServer::~HttpServer() {
  // serve() has returned (main joins it first); whatever still refers to
  // the state (a task of a pool that outlives the server) keeps it alive.
  for (auto& w : state_->workers) {
    if (w->thread.joinable()) w->thread.join();
  }
}

int HttpServer::bind() {
  State& s = *state_;
  const std::string where = s.config.host + ":" + std::to_string(s.config.port);
  try {
    net::io_context& ioc = s.workers[0]->ioc;
    tcp::resolver resolver(ioc);
    const auto found = resolver.resolve(s.config.host, std::to_string(s.config.port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service);
    if (found.empty()) throw std::runtime_error("no address");
    const tcp::endpoint endpoint = found.begin()->endpoint();
    s.acceptor.emplace(ioc);
    s.acceptor->open(endpoint.protocol());
    s.acceptor->set_option(net::socket_base::reuse_address(true));
    s.acceptor->bind(endpoint);
    s.acceptor->listen(static_cast<int>(s.config.http.backlog));
    s.accept_retry.emplace(ioc);
    s.listen_fd.store(s.acceptor->native_handle());
    return s.acceptor->local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    s.acceptor.reset();
    throw std::runtime_error("cannot listen on " + where + ": " + e.code().message());
  } catch (const std::exception& e) {
    s.acceptor.reset();
    throw std::runtime_error("cannot listen on " + where + ": " + e.what());
  }
}

void HttpServer::serve() {
  State& s = *state_;
  for (auto& w : s.workers) {
    Worker* worker = w.get();
    worker->arm_sweep();
    worker->thread = std::thread([worker, log = s.log] {
      const std::string name = "crewd-io-" + std::to_string(worker->index);
      ::pthread_setname_np(::pthread_self(), name.c_str());
      for (;;) {
        try {
          worker->ioc.run();
          break;
        } catch (const std::exception& e) {
          log->error("I/O thread {}: {}", worker->index, e.what());
        }
      }
      worker->done.store(true);
    });
  }
  net::post(s.workers[0]->ioc, [&s] { s.accept_next(); });
  // Until every I/O thread has run out of work; past stop()'s deadline,
  // completions of tasks that still run are given up.
  for (;;) {
    const bool all_done = std::all_of(s.workers.begin(), s.workers.end(),
                                      [](const auto& w) { return w->done.load(); });
    if (all_done) break;
    const auto deadline = s.stop_deadline.load();
    if (deadline != Clock::time_point::max() && Clock::now() >= deadline) {
      s.log->warn("stop deadline: giving up on completions of tasks still running");
      for (auto& w : s.workers) w->ioc.stop();
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  for (auto& w : s.workers) w->thread.join();
}

void HttpServer::halt() noexcept { state_->gate.halt(); }

void HttpServer::close_admission() noexcept {
  state_->gate.cut();
  for (auto& w : state_->workers) net::post(w->ioc, [worker = w.get()] { worker->cut(); });
}

bool HttpServer::wait_first_requests(Clock::time_point deadline, std::stop_token stop) const {
  const Gate& g = state_->gate;
  return poll_until([&g] { return g.first_pending() == 0; }, deadline, stop);
}

bool HttpServer::wait_admitted(Clock::time_point deadline, std::stop_token stop) const {
  const Gate& g = state_->gate;
  return poll_until([&g] { return g.admitted_open() == 0; }, deadline, stop);
}

void HttpServer::stop(Clock::time_point deadline) {
  State& s = *state_;
  s.stop_deadline.store(deadline);
  const auto slack = std::min<Clock::duration>(
      kAbandonSlack,
      std::max<Clock::duration>(deadline - Clock::now(), Clock::duration::zero()) / 2);
  const auto force_at = deadline - slack;
  const int fd = s.listen_fd.load();
  if (fd >= 0) {
    // Closing a listening socket resets the connections still in its
    // accept queue, and a burst of clients keeps that queue filled. So
    // first drop every new client's SYN (it is retransmitted a second
    // later and then meets the closed port: connection refused), let the
    // handshakes already answered complete (their ACKs pass), let the
    // accept loop take what is queued (bounded), then close. Accepted
    // connections inherit the filter; it drops nothing they receive.
    static sock_filter drop_syn[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 13),           // the TCP header's flags
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x12),        // SYN and ACK
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x02, 0, 1),  // a SYN alone:
        BPF_STMT(BPF_RET | BPF_K, 0),                     //   dropped
        BPF_STMT(BPF_RET | BPF_K, 0xffffffff),            // anything else passes
    };
    const sock_fprog drop{static_cast<unsigned short>(std::size(drop_syn)), drop_syn};
    if (::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &drop, sizeof(drop)) == 0) {
      // A handshake answered just before the filter completes within a
      // round trip: on loopback or in a data centre, well within the settle time.
      const auto attached = Clock::now();
      const auto settled = attached + 20ms;
      const auto bound = attached + 200ms;
      for (;;) {
        const auto now = Clock::now();
        if (now >= bound) break;
        tcp_info info{};
        socklen_t len = sizeof(info);
        // For a listening socket tcpi_unacked is the accept queue's length.
        if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) break;
        if (info.tcpi_unacked == 0 && now >= settled) break;
        std::this_thread::sleep_for(1ms);
      }
    }
  }
  // The listener goes first (on its own thread), then each I/O thread
  // closes its idle connections and winds down once it has none.
  net::post(s.workers[0]->ioc, [&s] { s.close_listener(); });
  const std::size_t open = s.open.load();
  for (auto& w : s.workers) {
    net::post(w->ioc, [worker = w.get(), force_at] { worker->begin_stop(force_at); });
  }
  s.log->info("listener closed; {} client connections open, idle ones closed", open);
}

void HttpServer::add_readiness_check(std::function<std::string()> check) {
  state_->readiness_checks.push_back(std::move(check));
}

bool HttpServer::halting() const noexcept { return state_->gate.halting(); }
std::size_t HttpServer::first_requests_pending() const noexcept {
  return state_->gate.first_pending();
}
std::size_t HttpServer::admitted_in_flight() const noexcept { return state_->gate.admitted_open(); }
std::size_t HttpServer::io_threads() const noexcept { return state_->workers.size(); }
std::size_t HttpServer::max_connections() const noexcept { return state_->max_connections; }

}  // namespace crewd

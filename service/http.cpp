#include "http.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <crew/detail/mutex.hpp>
#include <crew/error.hpp>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>

#include "job_runner.hpp"
#include "jobs.hpp"

namespace crewd {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;
using namespace std::chrono_literals;

// One client connection. Created by the accept loop, then owned by the http
// worker that serves it; the fields without atomics are touched only by the
// thread that owns it at the time (the hand-over is the pool's post).
struct Connection {
  Clock::time_point accepted;
  // Counted in Gate::first_pending_ until its first request is seen.
  bool counted = false;
  // An admitted request whose response is not written yet.
  bool admitted_open = false;
  // From a request's parsed headers to its response written. stop() ends
  // only connections that are not busy.
  std::atomic<bool> busy{false};
  Clock::time_point request_start{};
  // The client's address, known from the first request on; stop() finds
  // the connection's socket by it.
  std::string peer;
  bool tracked = false;
};

std::string peer_key(const std::string& addr, int port) {
  return addr + " " + std::to_string(port);
}

// An address as cpp-httplib writes Request::remote_addr (numeric), and its port.
std::pair<std::string, int> address_of(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "";
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return {host, port};
}

// The connection served by this thread (an http worker), set for the
// duration of the connection: cpp-httplib's callbacks do not say which
// connection a request came on.
thread_local Connection* t_connection = nullptr;

// Which requests still start work while crewd stops. The counters are
// sequentially consistent so that the cut (main's thread) and an admission
// (a connection's thread) cannot miss each other: each side writes its own
// variable, then reads the other's.
class Gate {
 public:
  void on_accept(Connection& c) noexcept {
    first_pending_.fetch_add(1);
    if (cut_.load()) {
      first_pending_.fetch_sub(1);
    } else {
      c.counted = true;
    }
  }

  // A request arrived on c; `work` says whether it would start work. Returns
  // whether it may. The first request of a connection accepted before the
  // cut is always admitted: the client sent it before it could know.
  bool on_request(Connection& c, bool work) noexcept {
    const bool first = c.counted;
    if (work) admitted_open_.fetch_add(1);  // before the first is uncounted
    if (first) {
      c.counted = false;
      first_pending_.fetch_sub(1);
    }
    if (!work) return true;
    if (!first && cut_.load()) {
      admitted_open_.fetch_sub(1);
      return false;
    }
    c.admitted_open = true;
    return true;
  }

  void on_response_done(Connection& c) noexcept {
    if (c.admitted_open) {
      c.admitted_open = false;
      admitted_open_.fetch_sub(1);
    }
  }

  void on_close(Connection& c) noexcept {
    if (c.counted) {
      c.counted = false;
      first_pending_.fetch_sub(1);
    }
    on_response_done(c);
  }

  void halt() noexcept { halting_.store(true); }
  void cut() noexcept { cut_.store(true); }
  [[nodiscard]] bool halting() const noexcept { return halting_.load(std::memory_order_relaxed); }
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

std::string dump(const Json& j) {
  // replace: a string holding invalid UTF-8 must not turn into an exception.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, int status, std::string_view message) {
  send_json(res, status, Json{{"error", std::string(message)}, {"status", status}});
}

struct RouteMatch {
  Route route = Route::unmatched;
  bool method_allowed = false;
  std::string_view arg;    // {n} of the factorial route
  const char* allow = "";  // for 405
};

RouteMatch match_route(std::string_view method, std::string_view path) {
  const bool get = method == "GET" || method == "HEAD";
  constexpr std::string_view kFactorial = "/api/v1/factorial/";
  if (path.starts_with(kFactorial)) {
    const std::string_view arg = path.substr(kFactorial.size());
    if (arg.empty() || arg.find('/') != std::string_view::npos) return {};
    return {Route::factorial, get, arg, "GET, HEAD"};
  }
  if (path == "/api/v1/jobs") return {Route::jobs, method == "POST", {}, "POST"};
  static constexpr std::pair<std::string_view, Route> kGets[] = {{"/api/v1/pools", Route::pools},
                                                                 {"/metrics", Route::metrics},
                                                                 {"/healthz", Route::healthz},
                                                                 {"/readyz", Route::readyz}};
  for (const auto& [p, r] : kGets) {
    if (path == p) return {r, get, {}, "GET, HEAD"};
  }
  return {};
}

std::string status_message(int status, std::size_t body_limit) {
  switch (status) {
    case 400:
      return "malformed request";
    case 404:
      return "no such route";
    case 413:
      return "request body larger than http.body_limit (" + std::to_string(body_limit) + " bytes)";
    case 414:
      return "request target too long";
    case 500:
      return "internal error";
    default:
      return "HTTP " + std::to_string(status);
  }
}

double millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A job's clock, shared between the task (which may end without a value:
// timed out, cancelled) and the handler.
struct JobTimes {
  std::atomic<std::int64_t> started_ns{0};
  std::atomic<std::int64_t> ended_ns{0};
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// One factorial handed to the compute pool, shared by the handler and the
// task. The handler sleeps on `state` (a futex) instead of a crew::Task
// handle: Task::wait polls with sched_yield() before it parks, and with one
// http worker per connection (64 under wrk) those yields were a fifth of the
// CPU time and a quarter of the throughput (docs/crewd.md, "Figures").
struct FactorialCall {
  static constexpr std::uint32_t kPending = 0;
  static constexpr std::uint32_t kDone = 1;
  static constexpr std::uint32_t kDropped = 2;  // the pool destroyed the task unrun
  static constexpr std::uint32_t kWaiter = 4;   // the handler sleeps on the futex
  std::atomic<std::uint32_t> state{kPending};
  std::uint64_t value = 0;  // written before kDone is published

  void finish(std::uint32_t outcome) noexcept {
    if ((state.exchange(outcome, std::memory_order_acq_rel) & kWaiter) != 0) {
      ::syscall(SYS_futex, &state, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }

  // kDone, kDropped, or kPending if `deadline` passed first.
  std::uint32_t wait_until(Clock::time_point deadline) noexcept {
    std::uint32_t cur = state.load(std::memory_order_acquire);
    while ((cur & ~kWaiter) == kPending) {
      if ((cur & kWaiter) == 0 &&
          !state.compare_exchange_weak(cur, cur | kWaiter, std::memory_order_acq_rel)) {
        continue;
      }
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) return kPending;
      const auto s = std::chrono::duration_cast<std::chrono::seconds>(left);
      const timespec ts{static_cast<time_t>(s.count()),
                        static_cast<long>(std::chrono::nanoseconds(left - s).count())};
      ::syscall(SYS_futex, &state, FUTEX_WAIT_PRIVATE, kPending | kWaiter, &ts, nullptr, 0);
      cur = state.load(std::memory_order_acquire);
    }
    return cur & ~kWaiter;
  }
};

// What the compute pool runs. Destroyed without having run (the queue
// deadline passed, or a shutdown dropped it), it tells the handler so.
class FactorialTask {
 public:
  FactorialTask(std::shared_ptr<FactorialCall> call, unsigned n) noexcept
      : call_(std::move(call)), n_(n) {}
  FactorialTask(FactorialTask&&) noexcept = default;
  FactorialTask& operator=(FactorialTask&&) = delete;
  FactorialTask(const FactorialTask&) = delete;
  FactorialTask& operator=(const FactorialTask&) = delete;
  ~FactorialTask() {
    if (call_) call_->finish(FactorialCall::kDropped);
  }
  void operator()() {
    call_->value = crewd::factorial(n_);
    std::exchange(call_, nullptr)->finish(FactorialCall::kDone);
  }

 private:
  std::shared_ptr<FactorialCall> call_;
  unsigned n_;
};

// The status code and message for a task that ended without a value.
std::pair<int, std::string> refusal(std::string_view pool, crew::TaskStatus status,
                                    crew::Errc reason) {
  const std::string why(crew::to_string(reason));
  switch (status) {
    case crew::TaskStatus::rejected:
      return {503, "pool " + std::string(pool) + " refused the task (" + why + ")"};
    case crew::TaskStatus::cancelled:
      return {503, "the task was cancelled (" + why + "): crewd is shutting down"};
    case crew::TaskStatus::timed_out:
      return {504, "the task ran past its deadline"};
    default:
      return {500, "the task failed"};
  }
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(const Config& config, ServicePools pools, std::shared_ptr<spdlog::logger> log,
       RequestMetrics& requests, std::vector<std::shared_ptr<prometheus::Collectable>> exposed)
      : config_(config),
        pools_(pools),
        help_limit_(config.compute.help ? pools.compute.options().max_workers : 0),
        log_(std::move(log)),
        requests_(requests),
        exposed_(std::move(exposed)) {
    setup();
  }

  int bind();
  void serve() {
    // stop() ends the loop by making accept() fail, which cpp-httplib
    // reports as an error.
    if (!listener_.listen_after_bind() && !stopping_.load()) {
      log_->error("the accept loop ended with an error");
    }
  }
  void stop();

  Gate& gate() noexcept { return gate_; }
  void add_readiness_check(std::function<std::string()> check) {
    readiness_checks_.push_back(std::move(check));
  }

 private:
  // What the http pool runs for one connection. If the pool refuses it (it
  // has stopped) or drops it unrun (its shutdown escalated), the destructor
  // still runs cpp-httplib's task, which then sees the closed listener and
  // only closes the socket: cpp-httplib left that to the task.
  class ConnectionTask {
   public:
    ConnectionTask(Impl* impl, std::unique_ptr<Connection> c, std::function<void()> fn) noexcept
        : impl_(impl), c_(std::move(c)), fn_(std::move(fn)) {}
    ConnectionTask(ConnectionTask&&) noexcept = default;
    ConnectionTask& operator=(ConnectionTask&&) = delete;
    ConnectionTask(const ConnectionTask&) = delete;
    ConnectionTask& operator=(const ConnectionTask&) = delete;
    ~ConnectionTask() {
      if (c_) impl_->run_connection(std::move(c_), fn_);
    }
    void operator()() { impl_->run_connection(std::move(c_), fn_); }

   private:
    Impl* impl_;
    std::unique_ptr<Connection> c_;
    std::function<void()> fn_;
  };

  // Plugged into cpp-httplib's new_task_queue: connections go to the http
  // pool instead of cpp-httplib's own thread pool.
  class PoolTaskQueue final : public httplib::TaskQueue {
   public:
    explicit PoolTaskQueue(Impl& impl) : impl_(impl) {}
    void enqueue(std::function<void()> fn) override { impl_.accept(std::move(fn)); }
    // The accept loop has ended (stop()): wait for the connections to end.
    void shutdown() override {
      (void)impl_.pools_.http.shutdown(crew::ShutdownMode::drain, impl_.config_.shutdown.timeout);
    }

   private:
    Impl& impl_;
  };

  void setup();
  void accept(std::function<void()> fn);
  void run_connection(std::unique_ptr<Connection> c, const std::function<void()>& fn);
  void track(Connection& c, const httplib::Request& req);
  void end_idle_connections();

  httplib::Server::HandlerResponse route(const httplib::Request& req, httplib::Response& res);
  void finished(const httplib::Request& req, const httplib::Response& res);
  void factorial(std::string_view arg, httplib::Response& res);
  void help_compute(const FactorialCall& call);
  bool read_body(const httplib::ContentReader& read, httplib::Response& res, std::string& body);
  void job(const std::string& body, httplib::Response& res);
  void pools(httplib::Response& res);
  void metrics(httplib::Response& res);

  const Config config_;
  ServicePools pools_;
  const std::size_t help_limit_;         // handlers running compute tasks at once, at most
  std::atomic<std::size_t> helpers_{0};  // handlers running compute tasks now
  std::shared_ptr<spdlog::logger> log_;
  RequestMetrics& requests_;
  const std::vector<std::shared_ptr<prometheus::Collectable>> exposed_;
  // Added before serve(), read by handlers only.
  std::vector<std::function<std::string()>> readiness_checks_;
  Gate gate_;
  std::atomic<int> listen_fd_{-1};
  std::atomic<bool> stopping_{false};
  int bound_port_ = 0;  // written by bind(), before serve()

  // Connections that have sent a request, by client address.
  crew::detail::Mutex connections_mu_;
  std::unordered_map<std::string, Connection*> connections_ CREW_GUARDED_BY(connections_mu_);

  httplib::Server listener_;  // last: its threads call into the members above
};

void HttpServer::Impl::setup() {
  listener_.new_task_queue = [this] { return new PoolTaskQueue(*this); };
  listener_.set_payload_max_length(config_.http.body_limit);
  listener_.set_keep_alive_max_count(config_.http.keep_alive_max);
  listener_.set_keep_alive_timeout(config_.http.keep_alive_timeout.count());
  listener_.set_read_timeout(config_.http.read_timeout);
  listener_.set_write_timeout(config_.http.write_timeout);
  listener_.set_socket_options([this](socket_t sock) {
    const int one = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // Inherited by accepted sockets: a response's header and body are two
    // writes, and Nagle would hold the second one for the client's ACK.
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    listen_fd_.store(sock);
  });
  listener_.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return route(req, res); });
  listener_.Post("/api/v1/jobs", [this](const httplib::Request&, httplib::Response& res,
                                        const httplib::ContentReader& read) {
    std::string body;
    if (read_body(read, res, body)) job(body, res);
  });
  listener_.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, res.status, status_message(res.status, config_.http.body_limit));
        return httplib::Server::HandlerResponse::Handled;
      }));
  listener_.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        log_->error("{} {}: {}", req.method, req.path, what);
        send_error(res, 500, "internal error");
      });
  listener_.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    // While halting, keep-alive clients are told to reconnect, so that their
    // next request meets the closed admission (503) or the closed listener.
    if (gate_.halting()) res.set_header("Connection", "close");
  });
  listener_.set_logger(
      [this](const httplib::Request& req, const httplib::Response& res) { finished(req, res); });
}

int HttpServer::Impl::bind() {
  int port = config_.port;
  if (port == 0) {
    port = listener_.bind_to_any_port(config_.host);
    if (port <= 0) port = -1;
  } else if (!listener_.bind_to_port(config_.host, port)) {
    port = -1;
  }
  if (port < 0) {
    throw std::runtime_error("cannot listen on " + config_.host + ":" +
                             std::to_string(config_.port) + ": " + std::strerror(errno));
  }
  bound_port_ = port;
  // cpp-httplib listens with a backlog of 5 (compiled into the library); a
  // burst of connections beyond it would have SYNs dropped and retried a
  // second later. listen(2) again only changes the backlog.
  if (::listen(listen_fd_.load(), static_cast<int>(config_.http.backlog)) != 0) {
    log_->warn("listen backlog {} not set: {}", config_.http.backlog, std::strerror(errno));
  }
  return port;
}

void HttpServer::Impl::accept(std::function<void()> fn) {
  auto c = std::make_unique<Connection>();
  c->accepted = Clock::now();
  gate_.on_accept(*c);
  requests_.connection_opened();
  // Blocks while the http pool's queue is full (overflow block): the accept
  // loop stops accepting, and the kernel's backlog holds new connections.
  const crew::Admission a =
      pools_.http.post(ConnectionTask(this, std::move(c), std::move(fn)), {.name = "connection"});
  if (a != crew::Admission::accepted) {
    log_->debug("connection refused by pool http: {}", crew::to_string(a));
  }
}

void HttpServer::Impl::run_connection(std::unique_ptr<Connection> c,
                                      const std::function<void()>& fn) {
  t_connection = c.get();
  fn();  // cpp-httplib's task: serve the connection, then close its socket
  t_connection = nullptr;
  if (c->tracked) {
    crew::detail::MutexLock lock(connections_mu_);
    connections_.erase(c->peer);
  }
  gate_.on_close(*c);
  requests_.connection_closed();
}

void HttpServer::Impl::track(Connection& c, const httplib::Request& req) {
  c.peer = peer_key(req.remote_addr, req.remote_port);
  crew::detail::MutexLock lock(connections_mu_);
  connections_[c.peer] = &c;
  c.tracked = true;
}

void HttpServer::Impl::stop() {
  // Not listener_.stop(): cpp-httplib would then close, unread, the
  // connections already accepted and still queued in the http pool (it
  // checks its listening socket before it reads a request), and their
  // clients would see a reset. Shutting the socket down makes accept() fail,
  // which ends the accept loop (cpp-httplib closes the socket itself), while
  // the queued connections are still served: 503 and Connection: close.
  stopping_.store(true);
  const int fd = listen_fd_.load();
  // Closing a listening socket resets the connections still in its accept
  // queue, and a burst of clients keeps that queue filled. So first drop
  // every new client's SYN (it is retransmitted a second later and then
  // meets the closed port: connection refused), let the handshakes already
  // answered complete (their ACKs pass: dropping those too left clients
  // that believed themselves connected, and were reset when their request
  // was retransmitted to the closed port), let the accept loop take what is
  // queued (bounded), then close. Accepted connections inherit the filter;
  // it drops nothing they receive.
  static sock_filter drop_syn[] = {
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 13),           // the TCP header's flags
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x12),        // SYN and ACK
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x02, 0, 1),  // a SYN alone:
      BPF_STMT(BPF_RET | BPF_K, 0),                     //   dropped
      BPF_STMT(BPF_RET | BPF_K, 0xffffffff),            // anything else passes
  };
  const sock_fprog drop{static_cast<unsigned short>(std::size(drop_syn)), drop_syn};
  if (::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &drop, sizeof(drop)) == 0) {
    // A handshake answered just before the filter completes within a round
    // trip: on loopback or in a data centre, well within the settle time.
    const auto attached = Clock::now();
    const auto settled = attached + 20ms;
    const auto deadline = attached + 200ms;
    tcp_info info{};
    socklen_t len = sizeof(info);
    // For a listening socket tcpi_unacked is the accept queue's length.
    for (;;) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      len = sizeof(info);
      if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) break;
      if (info.tcpi_unacked == 0 && now >= settled) break;
      std::this_thread::sleep_for(1ms);
    }
  }
  ::shutdown(fd, SHUT_RDWR);
  end_idle_connections();
}

// A connection idle between requests waits in cpp-httplib for its next
// request for up to the keep-alive timeout, and cpp-httplib does not say
// which socket a connection has. So: find crewd's client sockets among the
// process's descriptors (local port = the listening port), and shut down
// those whose client has no request in progress; that ends the wait at
// once. Busy ones finish their response, which says Connection: close
// (crewd is halting), and end. No socket is accepted any more, so a
// descriptor number cannot be reused by a new connection meanwhile.
void HttpServer::Impl::end_idle_connections() {
  std::size_t ended = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    crew::detail::MutexLock lock(connections_mu_);
    while (const dirent* e = ::readdir(dir)) {
      int fd = -1;
      const std::string_view name(e->d_name);
      if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc{}) continue;
      sockaddr_storage local{};
      sockaddr_storage peer{};
      socklen_t local_len = sizeof(local);
      socklen_t peer_len = sizeof(peer);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
          ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
        continue;  // not a connected socket
      }
      const auto [local_addr, local_port] = address_of(local);
      if (local_port != bound_port_) continue;
      const auto [peer_addr, peer_port] = address_of(peer);
      const auto it = connections_.find(peer_key(peer_addr, peer_port));
      // Not tracked yet: no request read so far; it is served (503 and
      // Connection: close) rather than cut, or ends at its keep-alive timeout.
      if (it == connections_.end() || it->second->busy.load()) continue;
      ::shutdown(fd, SHUT_RDWR);
      ++ended;
    }
    ::closedir(dir);
  }
  log_->info("listener closed; {} idle client connections ended", ended);
}

httplib::Server::HandlerResponse HttpServer::Impl::route(const httplib::Request& req,
                                                         httplib::Response& res) {
  using R = httplib::Server::HandlerResponse;
  Connection* c = t_connection;
  if (c != nullptr) {
    gate_.on_response_done(*c);
    c->request_start = Clock::now();
    c->busy.store(true);
    if (!c->tracked) track(*c, req);
  }
  const RouteMatch m = match_route(req.method, req.path);
  if (m.route == Route::unmatched) {
    send_error(res, 404, "no such route");
    return R::Handled;
  }
  if (!m.method_allowed) {
    res.set_header("Allow", m.allow);
    send_error(res, 405, std::string("method not allowed; allowed: ") + m.allow);
    return R::Handled;
  }
  const bool work = m.route == Route::factorial || m.route == Route::jobs;
  if (c != nullptr && !gate_.on_request(*c, work)) {
    send_error(res, 503, "crewd is shutting down");
    return R::Handled;
  }
  switch (m.route) {
    case Route::factorial:
      factorial(m.arg, res);
      return R::Handled;
    case Route::jobs:
      return R::Unhandled;  // cpp-httplib reads the body, then calls job()
    case Route::pools:
      pools(res);
      return R::Handled;
    case Route::metrics:
      metrics(res);
      return R::Handled;
    case Route::healthz:
      send_json(res, 200, Json{{"status", "ok"}});
      return R::Handled;
    case Route::readyz:
      if (gate_.halting()) {
        send_json(res, 503, Json{{"status", "halting"}});
        return R::Handled;
      }
      for (const auto& check : readiness_checks_) {
        if (std::string why = check(); !why.empty()) {
          send_json(res, 503, Json{{"status", "not ready"}, {"reason", why}});
          return R::Handled;
        }
      }
      send_json(res, 200, Json{{"status", "ready"}});
      return R::Handled;
    case Route::unmatched:
      break;
  }
  return R::Unhandled;
}

void HttpServer::Impl::finished(const httplib::Request& req, const httplib::Response& res) {
  Connection* c = t_connection;
  Clock::duration latency{0};
  if (c != nullptr && c->busy.load()) latency = Clock::now() - c->request_start;
  requests_.observe(match_route(req.method, req.path).route, res.status, latency);
  if (log_->should_log(spdlog::level::debug)) {
    log_->debug("{} {} {} {:.3f} ms", req.method, req.path, res.status, millis(latency));
  }
  if (c != nullptr) {
    gate_.on_response_done(*c);
    c->busy.store(false);
  }
}

// While its factorial is queued, the handler runs the compute pool's queued
// tasks (in queue order: its own, or one ahead of it) on its own thread, as
// crew::Group::wait does: it would otherwise sleep while a compute worker
// wakes, runs a 20 ns task and wakes it again, two thread hand-offs that cost
// a quarter of the route's throughput on two CPUs (docs/crewd.md, "Figures").
// The tasks keep the pool's admission, queue deadline, accounting and
// shutdown. At most help_limit_ handlers help at once, so no more than twice
// compute.workers factorials run at the same time.
void HttpServer::Impl::help_compute(const FactorialCall& call) {
  while (call.state.load(std::memory_order_acquire) == FactorialCall::kPending) {
    std::size_t h = helpers_.load(std::memory_order_relaxed);
    do {
      if (h >= help_limit_) return;
    } while (!helpers_.compare_exchange_weak(h, h + 1, std::memory_order_relaxed));
    const bool ran = pools_.compute.run_pending_task();
    helpers_.fetch_sub(1, std::memory_order_relaxed);
    if (!ran) return;  // a compute worker has it
  }
}

void HttpServer::Impl::factorial(std::string_view arg, httplib::Response& res) {
  const auto parsed = parse_factorial_n(arg);
  if (const auto* e = std::get_if<ParseError>(&parsed)) return send_error(res, 400, e->message);
  const unsigned n = std::get<unsigned>(parsed);
  std::uint64_t value = 0;
  if (config_.compute.inline_factorial) {
    value = crewd::factorial(n);
  } else {
    auto call = std::make_shared<FactorialCall>();
    const crew::Admission a =
        pools_.compute.post(FactorialTask(call, n),
                            {.name = "factorial", .queue_timeout = config_.compute.queue_timeout});
    if (a != crew::Admission::accepted) {
      return send_error(res, 503,
                        "pool compute refused the task (" + std::string(crew::to_string(a)) + ")");
    }
    help_compute(*call);
    // The queue timeout bounds the wait; the margin covers the run itself.
    switch (call->wait_until(Clock::now() + config_.compute.queue_timeout + 5s)) {
      case FactorialCall::kDone:
        value = call->value;
        break;
      case FactorialCall::kDropped:
        return send_error(res, 503,
                          "pool compute did not run the task (queue deadline or shutdown)");
      default:
        return send_error(res, 503, "pool compute did not run the task in time");
    }
  }
  // By hand: this is the route the throughput figures measure.
  char buf[64] = "{\"n\":";
  char* p = buf + 5;
  p = std::to_chars(p, buf + sizeof(buf), n).ptr;
  constexpr std::string_view kResult = ",\"result\":";
  p = std::copy(kResult.begin(), kResult.end(), p);
  p = std::to_chars(p, buf + sizeof(buf), value).ptr;
  *p++ = '}';
  res.status = 200;
  res.set_content(buf, static_cast<std::size_t>(p - buf), "application/json");
}

// cpp-httplib enforces the body limit for a Content-Length body (413, the
// body skipped) but reads a chunked one without bound, so the limit is
// enforced here too. Past the limit the rest is read and dropped, up to a
// cap, so that the client can read the 413 instead of meeting a reset.
bool HttpServer::Impl::read_body(const httplib::ContentReader& read, httplib::Response& res,
                                 std::string& body) {
  const std::size_t limit = config_.http.body_limit;
  const std::size_t drain_cap = std::max<std::size_t>(limit * 16, 1u << 20);
  std::size_t seen = 0;
  const bool complete = read([&](const char* data, std::size_t len) {
    seen += len;
    if (seen <= limit) body.append(data, len);
    return seen <= drain_cap;
  });
  if (res.status == 413 || seen > limit) {
    if (!complete) res.set_header("Connection", "close");  // the rest is still unread
    send_error(res, 413, status_message(413, limit));
    return false;
  }
  if (!complete) {
    res.set_header("Connection", "close");
    send_error(res, 400, "the request body could not be read");
    return false;
  }
  return true;
}

void HttpServer::Impl::job(const std::string& request_body, httplib::Response& res) {
  const auto parsed = parse_job_request(request_body, config_.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&parsed)) return send_error(res, 400, e->message);
  const JobRequest job = std::get<JobRequest>(parsed);
  const auto timeout = std::chrono::milliseconds(job.timeout_ms);
  auto times = std::make_shared<JobTimes>();
  const auto submitted = Clock::now();
  crew::Task<void> t = pools_.jobs.submit(
      [job, times](const crew::TaskContext& ctx) {
        times->started_ns.store(now_ns());
        (void)run_job_until(job, Clock::now() + std::chrono::milliseconds(job.ms), ctx.stop_token);
        times->ended_ns.store(now_ns());
      },
      {.name = job.name, .timeout = timeout, .queue_timeout = config_.jobs.queue_timeout});
  // Bounded by the pool: the queue deadline, the run deadline, then the
  // abandon grace, after which the task has an outcome whatever it does.
  const auto bound =
      config_.jobs.queue_timeout + timeout + pools_.jobs.options().abandon_grace + 5s;
  if (!t.wait_for(bound)) {
    (void)t.cancel();
    return send_error(res, 504, "the job did not finish in time");
  }
  const crew::TaskStatus status = t.status();
  Json body{{"name", job.name},  {"kind", std::string(to_string(job.kind))},
            {"ms", job.ms},      {"timeout_ms", job.timeout_ms},
            {"task_id", t.id()}, {"outcome", std::string(crew::to_string(status))}};
  const std::int64_t started = times->started_ns.load();
  const std::int64_t ended = times->ended_ns.load();
  const std::int64_t submitted_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(submitted.time_since_epoch()).count();
  if (started != 0) {
    body["queue_ms"] = static_cast<double>(started - submitted_ns) / 1e6;
    if (ended != 0) body["run_ms"] = static_cast<double>(ended - started) / 1e6;
  }
  body["total_ms"] = millis(Clock::now() - submitted);
  if (status == crew::TaskStatus::succeeded) return send_json(res, 200, body);
  const auto [code, message] = refusal("jobs", status, t.reason());
  body["error"] = message;
  body["reason"] = std::string(crew::to_string(t.reason()));
  body["status"] = code;
  if (code == 503 && t.reason() == crew::Errc::rejected) res.set_header("Retry-After", "1");
  send_json(res, code, body);
}

void HttpServer::Impl::pools(httplib::Response& res) {
  Json list = Json::array();
  for (const crew::Pool* p : {&pools_.http, &pools_.compute, &pools_.jobs}) {
    const crew::PoolStats s = p->stats();
    Json workers = Json::array();
    for (const crew::WorkerInfo& w : p->workers()) {
      Json worker{{"id", w.id},
                  {"state", std::string(crew::to_string(w.state))},
                  {"running_ms", millis(w.running_for)}};
      if (w.task.id != 0 || !w.task.name.empty()) {
        worker["task"] = Json{{"id", w.task.id}, {"name", w.task.name}};
      }
      workers.push_back(std::move(worker));
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
                        {"worker_list", std::move(workers)}});
  }
  send_json(res, 200, Json{{"halting", gate_.halting()}, {"pools", std::move(list)}});
}

void HttpServer::Impl::metrics(httplib::Response& res) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : exposed_) {
    auto f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  res.status = 200;
  res.set_content(prometheus::TextSerializer().Serialize(families),
                  "text/plain; version=0.0.4; charset=utf-8");
}

HttpServer::HttpServer(const Config& config, ServicePools pools,
                       std::shared_ptr<spdlog::logger> log, RequestMetrics& requests,
                       std::vector<std::shared_ptr<prometheus::Collectable>> exposed)
    : impl_(std::make_unique<Impl>(config, pools, std::move(log), requests, std::move(exposed))) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() { return impl_->bind(); }
void HttpServer::serve() { impl_->serve(); }
void HttpServer::halt() noexcept { impl_->gate().halt(); }
void HttpServer::close_admission() noexcept { impl_->gate().cut(); }
bool HttpServer::wait_first_requests(Clock::time_point deadline, std::stop_token stop) const {
  Gate& g = impl_->gate();
  return poll_until([&g] { return g.first_pending() == 0; }, deadline, stop);
}
bool HttpServer::wait_admitted(Clock::time_point deadline, std::stop_token stop) const {
  Gate& g = impl_->gate();
  return poll_until([&g] { return g.admitted_open() == 0; }, deadline, stop);
}
void HttpServer::stop() { impl_->stop(); }
void HttpServer::add_readiness_check(std::function<std::string()> check) {
  impl_->add_readiness_check(std::move(check));
}
bool HttpServer::halting() const noexcept { return impl_->gate().halting(); }
std::size_t HttpServer::first_requests_pending() const noexcept {
  return impl_->gate().first_pending();
}
std::size_t HttpServer::admitted_in_flight() const noexcept {
  return impl_->gate().admitted_open();
}

}  // namespace crewd

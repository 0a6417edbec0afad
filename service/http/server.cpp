// crewd's HTTP server (service/http/server.hpp): building the I/O threads and
// fitting the connection limit to the descriptor limit, binding, the accept
// loop, serve(), and the stop sequence (the listener's SYN filter and
// close, each I/O thread's stop, the deadline past which serve() gives up
// on completions). Connections are in connection.hpp, the I/O threads in
// io_thread.hpp, the admission rules in admission_gate.hpp.
//
// Threads: the constructor, bind(), serve() and the stop sequence run on
// the threads that call them (main's, in crewd); the accept loop
// (accept_next, on_accept, close_listener) runs on I/O thread 0, where the
// acceptor lives; a new connection is posted to the next I/O thread in
// turn. An accept callback can run just after close_listener() (which
// stop() posts to I/O thread 0) when its accept had already succeeded; each
// I/O thread keeps running until the notice close_listener() queues behind
// such a callback (IoThread::end_accepts) has reached it.
#include "http/server.hpp"

#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <crew/usable_cpus.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "http/scheduling.hpp"
#include "http/server_state.hpp"

namespace crewd {
namespace {

using http::Clock;
using http::error_code;
using http::Gate;
using http::IoThread;
using http::kAbandonSlack;
using http::tcp;
using State = HttpServer::State;
namespace net = boost::asio;
using namespace std::chrono_literals;

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

}  // namespace

// ---- State: the accept loop ----

void State::accept_next() {
  if (!acceptor || !acceptor->is_open()) return;
  const std::size_t i = next_worker++ % workers.size();
  acceptor->async_accept(workers[i]->ioc, [this, i](const error_code& ec, tcp::socket socket) {
    on_accept(ec, std::move(socket), i);
  });
}

void State::on_accept(const error_code& ec, tcp::socket socket, std::size_t worker) {
  const bool listening = acceptor && acceptor->is_open();
  if (ec) {
    if (!listening || ec == net::error::operation_aborted) return;  // closed: stop()
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
  // Served even if the listener has closed since: the reactor accepted it
  // first (which is what stop() waits for) and queues the completion when
  // its turn ends, which can be after close_listener. Dropping it here
  // would reset a client whose request may be on its way.
  const bool counted = gate.on_accept();
  // The connection's slot, taken here (one thread accepts), so that a burst
  // of accepts cannot pass the limit before their connections start.
  const bool over = open.fetch_add(1, std::memory_order_relaxed) >= max_connections;
  net::post(workers[worker]->ioc, [w = workers[worker].get(), s = std::move(socket), counted,
                                   over]() mutable { w->adopt(std::move(s), counted, over); });
  if (listening) accept_next();
}

void State::close_listener() {
  if (acceptor && acceptor->is_open()) {
    error_code ec;
    acceptor->close(ec);
  }
  if (accept_retry) accept_retry->cancel();
  // A connection accepted before the close may still have its completion
  // queued here, behind this handler (an accept that succeeded at once is
  // queued, not run); no accept starts after the close. So a handler posted
  // now runs after the last on_accept, and the notices it posts reach each
  // I/O thread after the last adopt() handed to it: until then an I/O
  // thread keeps running even when it is stopping with no connection left.
  net::post(workers[0]->ioc, [this] {
    for (auto& w : workers) net::post(w->ioc, [worker = w.get()] { worker->end_accepts(); });
  });
}

// ---- HttpServer ----

HttpServer::HttpServer(const Config& config, ServicePools pools,
                       std::shared_ptr<spdlog::logger> log,
                       std::shared_ptr<RequestMetrics> requests,
                       std::vector<std::shared_ptr<prometheus::Collectable>> exposed)
    : state_(std::make_shared<State>(config, pools, std::move(log), std::move(requests),
                                     std::move(exposed))) {
  std::size_t threads = config.http.io_threads;
  if (threads == 0) threads = crew::usable_cpus();
  for (std::size_t i = 0; i < threads; ++i) {
    state_->workers.push_back(std::make_unique<IoThread>(*state_, i));
  }
  // Every connection is a descriptor, and so is each close that lingers
  // (kLinger): the two limits fit what the process may open (raised to its
  // hard limit), with room for everything else. Lingering closes get what
  // the connections leave, and at least an eighth.
  rlimit nofile{};
  std::size_t limit = config.http.max_connections;
  std::size_t lingering = limit;
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    if (nofile.rlim_cur < nofile.rlim_max) {
      rlimit raised = nofile;
      raised.rlim_cur = nofile.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) nofile = raised;
    }
    constexpr rlim_t kReserve = 128;  // log, /proc reads, Redis, pools' eventfds...
    if (nofile.rlim_cur != RLIM_INFINITY) {
      const auto sockets = static_cast<std::size_t>(
          nofile.rlim_cur > 2 * kReserve ? nofile.rlim_cur - kReserve : nofile.rlim_cur / 2);
      const std::size_t fit = sockets - sockets / 8;
      if (fit < limit) {
        state_->log->warn(
            "http.max_connections {} lowered to {}: the process may open {} descriptors "
            "(ulimit -n), {} of them kept for closing connections",
            limit, fit, static_cast<std::uint64_t>(nofile.rlim_cur), sockets - fit);
        limit = fit;
      }
      lingering = sockets - limit;
    }
  }
  state_->max_connections = std::max<std::size_t>(limit, 1);
  state_->max_lingering = lingering;
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
    IoThread* worker = w.get();
    worker->arm_sweep();
    worker->thread = std::thread([worker, log = s.log, slice = s.config.http.io_slice,
                                  fifo = s.config.http.io_policy == Config::Http::IoPolicy::fifo] {
      // The scheduling first: a thread seen by its name has it. Each I/O
      // thread is refused or allowed alike; the first one says so.
      bool real_time = false;
      if (fifo) {
        const std::string error = set_real_time(1);
        real_time = error.empty();
        if (!real_time && worker->index == 0) {
          log->warn("http.io_policy fifo: the I/O threads stay under SCHED_OTHER: {}", error);
        }
      }
      if (!real_time) {
        if (const std::string error = set_time_slice(slice); !error.empty() && worker->index == 0) {
          log->warn("http.io_slice_us: the I/O threads keep the system's time slice: {}", error);
        }
      }
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

void HttpServer::close_admission(Clock::time_point receive_by) noexcept {
  state_->gate.cut(
      std::chrono::duration_cast<std::chrono::nanoseconds>(receive_by.time_since_epoch()).count());
  for (auto& w : state_->workers) net::post(w->ioc, [worker = w.get()] { worker->cut(); });
}

bool HttpServer::wait_first_requests(Clock::time_point deadline, std::stop_token stop) const {
  const Gate& g = state_->gate;
  return poll_until([&g] { return g.first_pending() == 0 && g.handing_over() == 0; }, deadline,
                    stop);
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
      // The queue can only shrink from here, as fast as the accept loop
      // takes it; the bound (1 s, and never past force_at) is for an
      // accept loop that does not run. 200 ms was too short for a burst of
      // a few dozen queued connections under ThreadSanitizer.
      const auto attached = Clock::now();
      const auto settled = attached + 20ms;
      const auto bound = std::min<Clock::time_point>(attached + 1s, force_at);
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

std::string HttpServer::State::not_ready_reason() const {
  if (gate.halting()) return "halting";
  for (const auto& check : readiness_checks) {
    if (std::string why = check(); !why.empty()) return why;
  }
  return {};
}

void HttpServer::set_console(std::shared_ptr<ui::Console> console) {
  state_->console = std::move(console);
}

bool HttpServer::halting() const noexcept { return state_->gate.halting(); }
std::string HttpServer::not_ready_reason() const { return state_->not_ready_reason(); }
std::size_t HttpServer::first_requests_pending() const noexcept {
  return state_->gate.first_pending();
}
std::size_t HttpServer::admitted_in_flight() const noexcept { return state_->gate.admitted_open(); }
std::size_t HttpServer::io_threads() const noexcept { return state_->workers.size(); }
std::size_t HttpServer::max_connections() const noexcept { return state_->max_connections; }

}  // namespace crewd

// service/http/io_thread.hpp: one of crewd's I/O threads: its io_context, the
// connections it serves (a list threaded through them) and the sweep that
// enforces their deadlines and the connection limit.
//
// Threads: every field and member function belongs to the thread running
// `ioc` (the constructor and `thread` aside: HttpServer builds and joins
// them); other threads reach it only by posting to `ioc` (the accept loop:
// adopt(), then end_accepts() once the listener is closed; close_admission:
// cut(); stop(): begin_stop()). `done` is set by
// the thread when run() returns and read by serve(). The sweep timer's
// callback runs on this thread every kSweepInterval until the thread is
// stopping with no connection left.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <optional>
#include <thread>

#include "http/server.hpp"

namespace crewd::http {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

class Connection;
using State = HttpServer::State;

// One I/O thread: its io_context and the connections it serves.
struct IoThread {
  IoThread(State& s, std::size_t i) : state(s), index(i) {}

  void adopt(tcp::socket socket, bool counted, bool over);
  void sweep();
  void arm_sweep();
  void cut();
  void begin_stop(Clock::time_point force_at);
  // The accept loop has handed over its last connection (posted by I/O
  // thread 0 after every adopt() it posted here): from now on the thread
  // may run out of work once it is stopping.
  void end_accepts();
  bool evict_one();
  void link(Connection* c) noexcept;
  // A close found every lingering slot taken (State::max_lingering): logs
  // it, at most every 10 s per thread.
  void note_linger_cut();
  void unlink(Connection* c) noexcept;

  State& state;
  const std::size_t index;
  // This thread's connections (a list threaded through them).
  Connection* first = nullptr;
  std::size_t count = 0;
  bool stopping = false;
  // end_accepts() has run. The work guard is kept until both this and
  // `stopping` hold: an adopt() posted after run() returned would never run,
  // and its client would never be answered.
  bool accepts_over = false;
  Clock::time_point force_close_at = Clock::time_point::max();
  bool forced = false;
  bool sweeping = false;        // the sweep timer is armed
  std::size_t linger_cuts = 0;  // since the last warning
  Clock::time_point last_linger_warning{};
  std::atomic<bool> done{false};  // run() returned

  net::io_context ioc{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work{ioc.get_executor()};
  net::steady_timer sweep_timer{ioc};
  std::thread thread;
};

}  // namespace crewd::http

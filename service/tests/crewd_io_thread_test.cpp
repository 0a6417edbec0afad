// One I/O thread in-process (service/http/io_thread.hpp): the hand-over of a
// connection from the accept loop to a thread that is stopping. Timing that
// the crewd process cannot be made to show on demand (I/O thread 0 late by
// more than a sweep behind another thread) is set up here by posting to the
// thread directly.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <crew/pool.hpp>
#include <memory>
#include <string>
#include <thread>

#include "crewd_harness.hpp"
#include "http/routes.hpp"
#include "http/server_state.hpp"

namespace crewd::test {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// A server state with one I/O thread running, as HttpServer::serve() runs it.
class OneIoThread {
 public:
  OneIoThread()
      : compute_({.name = "compute", .max_workers = 1}),
        jobs_({.name = "jobs", .max_workers = 1}),
        state_(std::make_shared<HttpServer::State>(
            Config{}, ServicePools{compute_, jobs_}, std::make_shared<spdlog::logger>("test"),
            std::make_shared<RequestMetrics>(http::route_labels()),
            std::vector<std::shared_ptr<prometheus::Collectable>>{})) {
    state_->max_connections = 16;
    state_->workers.push_back(std::make_unique<http::IoThread>(*state_, 0));
    http::IoThread& w = io();
    w.arm_sweep();
    w.thread = std::thread([&w] {
      w.ioc.run();
      w.done.store(true);
    });
  }
  OneIoThread(const OneIoThread&) = delete;
  OneIoThread& operator=(const OneIoThread&) = delete;
  ~OneIoThread() {
    io().ioc.stop();  // whatever the test left running
    io().thread.join();
  }

  http::IoThread& io() { return *state_->workers[0]; }
  HttpServer::State& state() { return *state_; }

  // Waits (bounded) until the thread's run() has returned.
  bool ended_within(std::chrono::milliseconds bound) {
    const auto until = Clock::now() + bound * kSlowdown;
    while (!io().done.load()) {
      if (Clock::now() >= until) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }

 private:
  crew::Pool compute_;
  crew::Pool jobs_;
  std::shared_ptr<HttpServer::State> state_;
};

// The accept loop's last connection can reach an I/O thread after that
// thread began its stop and swept with no connection left: the thread must
// still be there to serve it, and end only once the accept loop is over.
TEST(CrewdIoThread, AConnectionHandedOverAfterTheStopIsServed) {
  crew::test::Watchdog watchdog;
  OneIoThread server;
  http::IoThread& w = server.io();
  net::post(w.ioc, [&w] { w.begin_stop(Clock::now() + 30s); });
  // Three sweeps: the thread has swept with nothing to serve.
  std::this_thread::sleep_for(3 * http::kSweepInterval);

  // The connection, accepted onto the thread's io_context as the accept
  // loop does, then handed over as on_accept does.
  net::io_context accepting;
  tcp::acceptor acceptor(accepting, tcp::endpoint(net::ip::address_v4::loopback(), 0));
  Socket client = connect_to(acceptor.local_endpoint().port());
  ASSERT_GE(client.fd(), 0) << std::strerror(errno);
  tcp::socket accepted = acceptor.accept(w.ioc);
  HttpServer::State& s = server.state();
  const bool counted = s.gate.on_accept();
  s.open.fetch_add(1);
  net::post(w.ioc, [&w, socket = std::move(accepted), counted]() mutable {
    w.adopt(std::move(socket), counted, /*over=*/false);
  });

  Exchange ex;
  ASSERT_TRUE(write_all(client.fd(), request_text("GET", "/healthz"), ex.error));
  read_response(client.fd(), ex, Clock::now() + 5s * kSlowdown);
  EXPECT_EQ(ex.outcome, Exchange::Outcome::response)
      << to_string(ex.outcome) << ": nothing ran the hand-over";
  EXPECT_EQ(ex.status, 200) << ex.body;
  EXPECT_FALSE(w.done.load()) << "the thread ended before the accept loop did";

  // The accept loop's end: the thread winds down once its connection has
  // closed (after its linger).
  net::post(w.ioc, [&w] { w.end_accepts(); });
  EXPECT_TRUE(server.ended_within(5s)) << "the thread kept running after the accept loop ended";
  EXPECT_EQ(s.open.load(), 0u);
}

}  // namespace
}  // namespace crewd::test

// A coroutine task awaiting an Asio operation through crew::on_callback:
// the operation completes on the io_context's thread, the coroutine
// resumes on a worker of its pool.
#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <thread>

#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;

[[gnu::noinline]] std::thread::id step_thread() {
  asm volatile("" ::: "memory");
  return std::this_thread::get_id();
}

Co<bool> wait_on_timer(boost::asio::io_context* io, std::thread::id* resumed_on) {
  boost::asio::steady_timer timer(*io, 20ms);
  auto start = [&timer](Resume<boost::system::error_code> resume) {
    timer.async_wait(std::move(resume));
  };
  const boost::system::error_code ec = co_await on_callback<boost::system::error_code>(start);
  *resumed_on = step_thread();
  co_return !ec;
}

TEST(CoroAsio, AnAsioTimerResumesTheCoroutineOnItsPool) {
  test::Watchdog dog;
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread([&io] { io.run(); });
  const std::thread::id io_id = io_thread.get_id();
  {
    Pool pool(test::fixed_workers("co", 2));
    std::thread::id resumed_on;
    EXPECT_TRUE(spawn(pool, wait_on_timer(&io, &resumed_on)).get());
    EXPECT_NE(resumed_on, io_id);
    EXPECT_NE(resumed_on, std::this_thread::get_id());
  }
  work.reset();
  io_thread.join();
}

}  // namespace
}  // namespace crew

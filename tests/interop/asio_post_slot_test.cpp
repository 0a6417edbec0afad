// crew/asio_post_slot.hpp: a post reserved on one thread and made from
// another without the io_context's lock. Each handler runs once, on a
// thread running the io_context, never inside post(); run() stays busy
// exactly while a slot is outstanding; a handler that throws leaves run()
// and the others run at the next run(); handlers still held when the
// io_context goes are destroyed unrun. And crew::asio's completions take
// that way to every executor of an io_context, and Asio's post otherwise;
// for a task that ran, only once the pool has published its outcome.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <crew/asio.hpp>
#include <crew/asio_post_slot.hpp>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "test_util.hpp"

namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using crew::asio::PostSlot;
using crew::test::kSlowdown;
using crew::test::Watchdog;

// run() on a thread of its own; done() once it has returned.
class Runner {
 public:
  explicit Runner(net::io_context& io)
      : returned_(done_.get_future()), thread_([this, &io] {
          id_.set_value(std::this_thread::get_id());
          io.run();
          done_.set_value();
        }) {
    thread_id_ = id_.get_future().get();
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  ~Runner() { thread_.join(); }
  [[nodiscard]] bool returned_within(std::chrono::milliseconds d) {
    return returned_.wait_for(d) == std::future_status::ready;
  }
  [[nodiscard]] std::thread::id id() const { return thread_id_; }

 private:
  std::promise<void> done_;
  std::future<void> returned_;
  std::promise<std::thread::id> id_;
  std::thread::id thread_id_;
  std::thread thread_;
};

TEST(AsioPostSlot, AHandlerPostedFromAnotherThreadRunsOnTheIoThread) {
  Watchdog dog;
  net::io_context io;
  PostSlot slot(io);
  Runner runner(io);
  // The slot keeps run() going.
  EXPECT_FALSE(runner.returned_within(50ms));
  std::promise<std::thread::id> ran_on;
  std::thread poster([&] { slot.post([&] { ran_on.set_value(std::this_thread::get_id()); }); });
  poster.join();
  EXPECT_FALSE(slot.reserved());
  auto f = ran_on.get_future();
  ASSERT_EQ(f.wait_for(10s * kSlowdown), std::future_status::ready);
  EXPECT_EQ(f.get(), runner.id());
  // Nothing else is outstanding: run() returns.
  EXPECT_TRUE(runner.returned_within(10s * kSlowdown));
}

TEST(AsioPostSlot, AHandlerNeverRunsInsidePost) {
  Watchdog dog;
  net::io_context io;
  bool ran = false;
  bool ran_inside = false;
  // From the io_context's own thread, where dispatch would run it inline.
  net::post(io, [&] {
    PostSlot slot(io);
    slot.post([&] { ran = true; });
    ran_inside = ran;
  });
  io.run();
  EXPECT_TRUE(ran);
  EXPECT_FALSE(ran_inside);
}

TEST(AsioPostSlot, ASlotDestroyedUnpostedLetsRunReturn) {
  Watchdog dog;
  net::io_context io;
  std::optional<PostSlot> slot(std::in_place, io);
  Runner runner(io);
  EXPECT_FALSE(runner.returned_within(50ms));
  std::thread([&] { slot.reset(); }).join();
  EXPECT_TRUE(runner.returned_within(10s * kSlowdown));
}

TEST(AsioPostSlot, AMovedSlotPostsOnceAndAMovedFromOneRefuses) {
  Watchdog dog;
  net::io_context io;
  PostSlot a(io);
  PostSlot b(std::move(a));
  EXPECT_FALSE(a.reserved());  // NOLINT(bugprone-use-after-move): what a move leaves
  EXPECT_TRUE(b.reserved());
  EXPECT_THROW(a.post([] {}), std::logic_error);
  int runs = 0;
  b.post([&] { ++runs; });
  EXPECT_THROW(b.post([&] { ++runs; }), std::logic_error);
  // Assigning over a reserved slot gives its reservation back.
  PostSlot c(io);
  PostSlot d(io);
  c = std::move(d);
  c.post([&] { ++runs; });
  io.run();
  EXPECT_EQ(runs, 2);
}

TEST(AsioPostSlot, ManyPostersEachHandlerRunsOnceAndRunReturnsAfterTheLast) {
  Watchdog dog;
  constexpr int kThreads = 4;
  constexpr int kEach = 20'000;
  net::io_context io;
  std::atomic<int> runs{0};
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(kThreads) * kEach);
  // Reserved here, before run() starts: posted from the threads while the
  // io_context drains, some before, some after each wake-up.
  std::vector<PostSlot> slots;
  slots.reserve(seen.size());
  for (std::size_t i = 0; i < seen.size(); ++i) slots.emplace_back(io);
  Runner runner(io);
  std::vector<std::thread> posters;
  for (int t = 0; t < kThreads; ++t) {
    posters.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const auto k = static_cast<std::size_t>(t * kEach + i);
        slots[k].post([&, k] {
          seen[k].fetch_add(1, std::memory_order_relaxed);
          runs.fetch_add(1, std::memory_order_relaxed);
        });
      }
    });
  }
  for (auto& p : posters) p.join();
  ASSERT_TRUE(runner.returned_within(30s * kSlowdown));
  EXPECT_EQ(runs.load(), kThreads * kEach);
  for (std::size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k].load(), 1) << k;
}

TEST(AsioPostSlot, SlotsReservedAndPostedWhileTheIoThreadDrainsKeepItBusy) {
  // Slots come and go while run() drains: each round reserves from a
  // handler (the io_context's thread) and posts from a worker thread, so
  // the wait ends and restarts many times; run() returns only after the
  // last round.
  Watchdog dog;
  constexpr int kRounds = 5'000;
  net::io_context io;
  std::atomic<int> left{kRounds};
  std::vector<std::thread> workers;
  std::mutex mu;
  std::function<void()> round = [&] {
    if (left.fetch_sub(1) <= 0) return;
    auto slot = std::make_shared<PostSlot>(io);
    const std::lock_guard lock(mu);
    workers.emplace_back([slot, &round] { slot->post(round); });
  };
  net::post(io, round);
  Runner runner(io);
  ASSERT_TRUE(runner.returned_within(60s * kSlowdown));
  EXPECT_LE(left.load(), 0);
  const std::lock_guard lock(mu);
  for (auto& w : workers) w.join();
}

TEST(AsioPostSlot, OnePostersHandlersRunInItsOrder) {
  Watchdog dog;
  constexpr int kCount = 10'000;
  net::io_context io;
  std::vector<PostSlot> slots;
  slots.reserve(kCount);
  for (int i = 0; i < kCount; ++i) slots.emplace_back(io);
  std::vector<int> order;
  order.reserve(kCount);
  Runner runner(io);
  std::thread poster([&] {
    for (int i = 0; i < kCount; ++i)
      slots[static_cast<std::size_t>(i)].post([&, i] { order.push_back(i); });
  });
  poster.join();
  ASSERT_TRUE(runner.returned_within(30s * kSlowdown));
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kCount));
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(AsioPostSlot, AThrowingHandlerLeavesRunAndTheOthersRunAtTheNextRun) {
  Watchdog dog;
  net::io_context io;
  int after = 0;
  {
    PostSlot first(io);
    PostSlot second(io);
    PostSlot third(io);
    first.post([] { throw std::runtime_error("handler"); });
    second.post([&] { ++after; });
    third.post([&] { ++after; });
  }
  EXPECT_THROW(io.run(), std::runtime_error);
  EXPECT_EQ(after, 0);
  io.restart();
  io.run();  // returns: nothing outstanding once they ran
  EXPECT_EQ(after, 2);
}

TEST(AsioPostSlot, HandlersStillHeldWhenTheIoContextGoesAreDestroyedUnrun) {
  Watchdog dog;
  auto token = std::make_shared<int>(0);
  bool ran = false;
  {
    net::io_context io;
    PostSlot slot(io);
    slot.post([&ran, token] { ran = true; });
    EXPECT_EQ(token.use_count(), 2);
  }
  EXPECT_FALSE(ran);
  EXPECT_EQ(token.use_count(), 1);
}

TEST(AsioPostSlot, CompletionsFindTheIoContextBehindTheirExecutor) {
  using crew::asio::detail::io_context_of;
  net::io_context io;
  net::thread_pool other(1);
  const auto strand = net::make_strand(io);
  EXPECT_EQ(io_context_of(io.get_executor()), &io);
  EXPECT_EQ(io_context_of(strand), &io);
  EXPECT_EQ(io_context_of(net::any_io_executor(io.get_executor())), &io);
  EXPECT_EQ(io_context_of(net::any_io_executor(strand)), &io);
  EXPECT_EQ(io_context_of(other.get_executor()), nullptr);
  EXPECT_EQ(io_context_of(net::any_io_executor(other.get_executor())), nullptr);
  other.join();
}

TEST(AsioPostSlot, CompletionsRunOnTheirHandlersExecutorWhicheverWayTheyGo) {
  Watchdog dog;
  crew::Pool pool(crew::PoolOptions{.max_workers = 2});
  net::io_context io;
  const auto strand = net::make_strand(io);
  net::thread_pool other(1);
  std::promise<bool> in_strand;
  std::promise<bool> on_other;
  // Through a slot of `io`, then dispatched into the strand.
  crew::asio::async_try_submit(
      pool, io.get_executor(), [] { return 1; },
      net::bind_executor(strand, [&](std::exception_ptr e, int v) {
        in_strand.set_value(!e && v == 1 && strand.running_in_this_thread());
      }));
  // No io_context: Asio's own post to the thread_pool.
  crew::asio::async_try_submit(
      pool, other.get_executor(), [] { return 2; },
      [&](std::exception_ptr e, int v) {
        on_other.set_value(!e && v == 2 && other.get_executor().running_in_this_thread());
      });
  Runner runner(io);
  auto a = in_strand.get_future();
  auto b = on_other.get_future();
  ASSERT_EQ(a.wait_for(10s * kSlowdown), std::future_status::ready);
  ASSERT_EQ(b.wait_for(10s * kSlowdown), std::future_status::ready);
  EXPECT_TRUE(a.get());
  EXPECT_TRUE(b.get());
  EXPECT_TRUE(runner.returned_within(10s * kSlowdown));
  other.join();
}

// A task's completion reaches the io_context once the pool has published
// the outcome: the handler finds the handle ready and the pool counting
// the task. One task at a time, on one CPU, with workers 5 nice steps
// below the I/O thread: the I/O thread, asleep, is woken by the worker's
// post and preempts it, so a completion posted from the task's run would
// run before the worker got back to publishing.
TEST(AsioPostSlot, ACompletionFindsItsTaskPublishedAndCounted) {
  Watchdog dog;
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  std::size_t first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // threads made from here inherit it
  constexpr int kTasks = 1000;
  int done = 0;  // the I/O thread's
  int unready = 0;
  int uncounted = 0;
  {
    crew::PoolOptions o;
    o.max_workers = 2;
    o.on_worker_start = [](std::uint64_t) {
      ASSERT_EQ(setpriority(PRIO_PROCESS, 0, 5), 0);  // the calling thread's on Linux
    };
    crew::Pool pool(o);
    net::io_context io;
    std::function<void()> next = [&] {
      auto handle = std::make_shared<crew::Task<void>>();
      const crew::TaskOptions opts{.timeout = 10s};  // a long task: its run is timed too
      crew::asio::async_try_submit(
          pool, io.get_executor(), [](std::stop_token) {}, opts,
          [&, handle](std::exception_ptr e) {
            if (e || !handle->ready() || handle->status() != crew::TaskStatus::succeeded) {
              ++unready;
            }
            if (pool.stats().outcomes.succeeded < static_cast<std::uint64_t>(++done)) ++uncounted;
            if (done < kTasks) next();
          },
          *handle);
    };
    net::post(io, next);
    Runner runner(io);
    ASSERT_TRUE(runner.returned_within(60s * kSlowdown));
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(done, kTasks);
  EXPECT_EQ(unready, 0);
  EXPECT_EQ(uncounted, 0);
}

}  // namespace

// crew/asio.hpp: submissions whose completion is an Asio completion token.
// Callbacks and std::future (C++20 coroutines: asio_awaitable_test.cpp);
// every way a task can end (value, exception, timed out, cancelled,
// refused at admission, dropped by a shutdown, expired in the queue)
// completes exactly once, on the handler's executor, and keeps
// io_context::run() busy until then.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <crew/asio.hpp>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "asio_test_util.hpp"
#include "replaced_new.hpp"  // operator new: fails one allocation on demand
#include "test_util.hpp"

namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using crew::test::kSlowdown;
using crew::test::WorkerHold;

// An io_context run by one thread of its own while the fixture lives.
class IoThread {
 public:
  IoThread() : work_(net::make_work_guard(ioc_)), thread_([this] { ioc_.run(); }) {}
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;
  ~IoThread() {
    work_.reset();
    thread_.join();
  }
  net::io_context& ioc() { return ioc_; }
  [[nodiscard]] std::thread::id id() const { return thread_.get_id(); }

 private:
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  std::thread thread_;
};

// The outcome of one completion, waited for with a bound. Handlers move the
// exception_ptr in: ThreadSanitizer does not see libstdc++'s (uninstrumented)
// reference count, so a copy released on the I/O thread after the test
// thread has read the exception would look like a race to it.
template <class T>
struct Outcome {
  std::promise<std::pair<std::exception_ptr, T>> promise;
  std::future<std::pair<std::exception_ptr, T>> future = promise.get_future();
  std::pair<std::exception_ptr, T> get() {
    if (future.wait_for(10s * kSlowdown) != std::future_status::ready) {
      ADD_FAILURE() << "no completion";
      return {};
    }
    return future.get();
  }
};

crew::Errc code_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const crew::Error& err) {
    return err.code();
  } catch (...) {
  }
  ADD_FAILURE() << "not a crew::Error";
  return crew::Errc::invalid_options;
}

crew::Admission admission_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const crew::Error& err) {
    return err.admission();
  } catch (...) {
  }
  return crew::Admission::accepted;
}

TEST(CrewAsio, ACallbackGetsTheValueOnTheExecutorsThread) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 2});
  Outcome<int> out;
  std::thread::id ran_on;
  std::thread::id completed_on;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(),
      [&ran_on] {
        ran_on = std::this_thread::get_id();
        return 6 * 7;
      },
      [&](std::exception_ptr e, int v) {
        completed_on = std::this_thread::get_id();
        out.promise.set_value({std::move(e), v});
      });
  const auto [e, v] = out.get();
  EXPECT_FALSE(e);
  EXPECT_EQ(v, 42);
  EXPECT_EQ(completed_on, io.id());
  EXPECT_NE(ran_on, io.id());
  EXPECT_TRUE(pool.wait_idle(5s * kSlowdown));  // the outcome is recorded after the completion
  EXPECT_EQ(pool.stats().outcomes.succeeded, 1u);
}

TEST(CrewAsio, AVoidTaskAndAnExceptionAreCompletedAndCounted) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 1});
  std::promise<std::exception_ptr> done;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), [] {}, {.name = "nothing"},
      [&](std::exception_ptr e) { done.set_value(std::move(e)); });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(10s * kSlowdown), std::future_status::ready);
  EXPECT_FALSE(f.get());

  Outcome<std::string> out;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), []() -> std::string { throw std::runtime_error("boom"); },
      {.name = "thrower"},
      [&](std::exception_ptr e, std::string v) {
        out.promise.set_value({std::move(e), std::move(v)});
      });
  const auto [e, v] = out.get();
  ASSERT_TRUE(e);
  EXPECT_TRUE(v.empty());
  try {
    std::rethrow_exception(e);
  } catch (const std::runtime_error& err) {
    EXPECT_STREQ(err.what(), "boom");
  }
  EXPECT_TRUE(pool.wait_idle(5s * kSlowdown));
  const crew::PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.succeeded, 1u);
  EXPECT_EQ(s.outcomes.failed, 1u) << "the pool counts the task as the function ended";
}

TEST(CrewAsio, TheHandlersAssociatedExecutorIsUsed) {
  IoThread io;
  IoThread other;
  crew::Pool pool({.name = "asio", .max_workers = 1});
  Outcome<int> out;
  std::thread::id completed_on;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), [] { return 1; },
      net::bind_executor(other.ioc().get_executor(), [&](std::exception_ptr e, int v) {
        completed_on = std::this_thread::get_id();
        out.promise.set_value({std::move(e), v});
      }));
  EXPECT_EQ(out.get().second, 1);
  EXPECT_EQ(completed_on, other.id());
}

TEST(CrewAsio, ARefusedSubmissionCompletesAtOnceWithTheAdmission) {
  IoThread io;
  crew::Pool pool(
      {.name = "asio", .max_workers = 1, .queue_capacity = 1, .overflow = crew::Overflow::reject});
  WorkerHold hold(pool);  // later tasks stay queued
  std::atomic<int> ran{0};
  Outcome<int> first;
  crew::asio::async_try_submit(
      pool, io.ioc().get_executor(), [&] { return ++ran; },
      [&](std::exception_ptr e, int v) {
        first.promise.set_value({std::move(e), v});
      });
  Outcome<int> second;
  crew::asio::async_try_submit(
      pool, io.ioc().get_executor(), [&] { return ++ran; }, {.name = "overflow"},
      [&](std::exception_ptr e, int v) {
        second.promise.set_value({std::move(e), v});
      });
  const auto [e, v] = second.get();
  ASSERT_TRUE(e);
  EXPECT_EQ(code_of(e), crew::Errc::rejected);
  EXPECT_EQ(admission_of(e), crew::Admission::full);
  EXPECT_EQ(v, 0);
  hold.release();
  const auto [e1, v1] = first.get();
  EXPECT_FALSE(e1);
  EXPECT_EQ(v1, 1);
  EXPECT_EQ(ran.load(), 1);

  (void)pool.shutdown(crew::ShutdownMode::drain, 5s);
  Outcome<int> closed;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), [&] { return ++ran; },
      [&](std::exception_ptr err, int r) {
        closed.promise.set_value({std::move(err), r});
      });
  const auto [e2, v2] = closed.get();
  ASSERT_TRUE(e2);
  EXPECT_EQ(code_of(e2), crew::Errc::rejected);
  EXPECT_EQ(admission_of(e2), crew::Admission::closed);
  EXPECT_EQ(ran.load(), 1);
}

TEST(CrewAsio, TasksDroppedByAShutdownCompleteWithShutdownDropped) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 1});
  WorkerHold hold(pool);
  constexpr int kTasks = 5;
  std::atomic<int> ran{0};
  std::vector<Outcome<int>> outs(kTasks);
  for (auto& out : outs) {
    crew::asio::async_submit(
        pool, io.ioc().get_executor(), [&] { return ++ran; }, {.name = "queued"},
        [&out](std::exception_ptr e, int v) {
          out.promise.set_value({std::move(e), v});
        });
  }
  const crew::ShutdownReport r = shut_down_soft_while_held(pool, hold);
  EXPECT_EQ(r.during.rejected, static_cast<std::uint64_t>(kTasks));
  for (auto& out : outs) {
    const auto [e, v] = out.get();
    ASSERT_TRUE(e);
    EXPECT_EQ(code_of(e), crew::Errc::shutdown_dropped);
  }
  EXPECT_EQ(ran.load(), 0);
}

TEST(CrewAsio, ATaskPastItsQueueDeadlineCompletesWithExpired) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 1});
  WorkerHold hold(pool);
  Outcome<int> out;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), [] { return 1; }, {.queue_timeout = 10ms},
      [&](std::exception_ptr e, int v) {
        out.promise.set_value({std::move(e), v});
      });
  std::this_thread::sleep_for(50ms);
  hold.release();
  const auto [e, v] = out.get();
  ASSERT_TRUE(e);
  EXPECT_EQ(code_of(e), crew::Errc::expired);
}

// The pool's supervisor completes an expired task at its queue deadline:
// the client hears of it then, not when a worker is free to reach the task.
TEST(CrewAsio, AnExpiredTaskCompletesAtItsDeadlineWhileEveryWorkerIsBusy) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 1});
  WorkerHold hold(pool);  // held until the end: no worker reaches the task
  std::atomic<int> ran{0};
  Outcome<int> out;
  const auto submitted = std::chrono::steady_clock::now();
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), [&ran] { return ++ran; }, {.queue_timeout = 50ms},
      [&](std::exception_ptr e, int v) {
        out.promise.set_value({std::move(e), v});
      });
  ASSERT_EQ(out.future.wait_for(500ms * kSlowdown), std::future_status::ready)
      << "the expired completion waits for a worker";
  const auto elapsed = std::chrono::steady_clock::now() - submitted;
  const auto [e, v] = out.future.get();
  ASSERT_TRUE(e);
  EXPECT_EQ(code_of(e), crew::Errc::expired);
  EXPECT_EQ(v, 0);
  EXPECT_GE(elapsed, 50ms);
  hold.release();
  EXPECT_TRUE(pool.wait_idle(5s * kSlowdown));
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(pool.stats().outcomes.rejected, 1u) << "counted once, when the worker popped it";
}

// A queue timeout too large to add to the clock means no deadline: a task
// dropped by a shutdown says so, not that it expired.
TEST(CrewAsio, AQueueTimeoutOfNanosecondsMaxIsNoDeadline) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 1});
  WorkerHold hold(pool);
  Outcome<int> out;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), [] { return 1; },
      {.queue_timeout = std::chrono::nanoseconds::max()},
      [&](std::exception_ptr e, int v) {
        out.promise.set_value({std::move(e), v});
      });
  (void)shut_down_soft_while_held(pool, hold);
  const auto [e, v] = out.get();
  ASSERT_TRUE(e);
  EXPECT_EQ(code_of(e), crew::Errc::shutdown_dropped);
}

// A submission the pool refuses by throwing (invalid options, out of
// memory) signals once: the exception, and no completion.
TEST(CrewAsio, ASubmissionThatThrowsDeliversNoCompletion) {
  crew::test::Watchdog watchdog;
  // Its worker started at once: a failed allocation of the submission does
  // not fall on starting it.
  crew::Pool pool(crew::test::fixed_workers("asio", 1));
  const std::vector<crew::TaskOptions> invalid = {
      {.priority = 200}, {.timeout = -1ms}, {.queue_timeout = -1ms}};
  for (const crew::TaskOptions& opts : invalid) {
    net::io_context ioc;
    int exceptions = 0;
    int calls = 0;
    try {
      crew::asio::async_submit(
          pool, ioc.get_executor(), [] { return 1; }, opts,
          [&calls](std::exception_ptr, int) { ++calls; });
    } catch (const crew::Error& e) {
      EXPECT_EQ(e.code(), crew::Errc::invalid_options);
      ++exceptions;
    }
    ioc.run();  // runs a completion, if one was posted
    EXPECT_EQ(exceptions, 1);
    EXPECT_EQ(calls, 0);
  }
  // The n-th allocation of the submission fails, for every n until one
  // succeeds: each submission ends in exactly one signal.
  bool submitted = false;
  int failed_submissions = 0;
  for (long n = 1; !submitted && n < 100; ++n) {
    net::io_context ioc;
    int exceptions = 0;
    int calls = 0;
    try {
      crew::test::t_fail_allocation_in = n;
      crew::asio::async_submit(
          pool, ioc.get_executor(), [] { return 1; }, {.name = "out of memory"},
          [&calls](std::exception_ptr e, int v) {
            EXPECT_FALSE(e);
            EXPECT_EQ(v, 1);
            ++calls;
          });
      submitted = true;
    } catch (const std::bad_alloc&) {
      ++exceptions;
      ++failed_submissions;
    }
    crew::test::t_fail_allocation_in = 0;
    ioc.run();  // until the completion, if there is one
    EXPECT_EQ(exceptions + calls, 1) << "allocation " << n;
  }
  EXPECT_TRUE(submitted);
  // At least the completion's own allocation; the task state and its
  // extras may come from the thread's block cache without one.
  EXPECT_GE(failed_submissions, 1);
  EXPECT_TRUE(pool.wait_idle(5s * kSlowdown));
}

TEST(CrewAsio, LongTasksGetTheirTokenAndEndAsThePoolCountsThem) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 2});
  // Returns before its deadline: the value.
  Outcome<std::uint64_t> ok;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(), [](const crew::TaskContext& ctx) { return ctx.id; },
      {.name = "ctx", .timeout = 5s},
      [&](std::exception_ptr e, std::uint64_t id) {
        ok.promise.set_value({std::move(e), id});
      });
  const auto [e0, id] = ok.get();
  EXPECT_FALSE(e0);
  EXPECT_GT(id, 0u);

  // Waits on its token until the deadline stops it: timed out.
  Outcome<int> late;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(),
      [](std::stop_token stop) {
        while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
        return 7;
      },
      {.name = "late", .timeout = 20ms},
      [&](std::exception_ptr e, int v) {
        late.promise.set_value({std::move(e), v});
      });
  const auto [e1, v1] = late.get();
  ASSERT_TRUE(e1);
  EXPECT_EQ(code_of(e1), crew::Errc::timed_out);
  EXPECT_EQ(v1, 0);

  // Stopped by a hard shutdown before its deadline: cancelled.
  std::atomic<bool> started{false};
  Outcome<int> stopped;
  crew::asio::async_submit(
      pool, io.ioc().get_executor(),
      [&started](std::stop_token stop) {
        started = true;
        while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
        return 7;
      },
      {.name = "stopped", .timeout = 60s},
      [&](std::exception_ptr e, int v) {
        stopped.promise.set_value({std::move(e), v});
      });
  while (!started) std::this_thread::sleep_for(1ms);
  (void)pool.shutdown(crew::ShutdownMode::hard, 5s);
  const auto [e2, v2] = stopped.get();
  ASSERT_TRUE(e2);
  EXPECT_EQ(code_of(e2), crew::Errc::cancelled);
  const crew::PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.timed_out, 1u);
  EXPECT_EQ(s.outcomes.cancelled, 1u);
}

TEST(CrewAsio, UseFutureWorks) {
  IoThread io;
  crew::Pool pool({.name = "asio", .max_workers = 1});
  std::future<int> f = crew::asio::async_submit(
      pool, io.ioc().get_executor(), [] { return 5; }, net::use_future);
  ASSERT_EQ(f.wait_for(10s * kSlowdown), std::future_status::ready);
  EXPECT_EQ(f.get(), 5);
  std::future<void> g = crew::asio::async_submit(
      pool, io.ioc().get_executor(), [] { throw std::logic_error("no"); }, net::use_future);
  ASSERT_EQ(g.wait_for(10s * kSlowdown), std::future_status::ready);
  EXPECT_THROW(g.get(), std::logic_error);
}

// io_context::run() without a work guard returns only once every completion
// has run: a submission is outstanding work until its handler has run.
TEST(CrewAsio, OutstandingSubmissionsKeepRunFromReturning) {
  net::io_context ioc;
  crew::Pool pool({.name = "asio", .max_workers = 2});
  std::atomic<int> completed{0};
  constexpr int kTasks = 100;
  for (int i = 0; i < kTasks; ++i) {
    crew::asio::async_submit(
        pool, ioc.get_executor(),
        [i] {
          std::this_thread::sleep_for(std::chrono::microseconds(100 * (i % 3)));
          return i;
        },
        [&](std::exception_ptr e, int) {
          EXPECT_FALSE(e);
          ++completed;
        });
  }
  ioc.run();
  EXPECT_EQ(completed.load(), kTasks);
}

// Submissions from several threads race a soft shutdown: each one completes
// exactly once, and the completions add up to the pool's outcomes.
TEST(CrewAsio, EverySubmissionCompletesExactlyOnceAcrossAShutdownRace) {
  IoThread io;
  crew::Pool pool({.name = "asio",
                   .max_workers = 2,
                   .queue_capacity = 256,
                   .overflow = crew::Overflow::reject});
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::atomic<int> completions{0};
  std::atomic<int> values{0};
  std::atomic<int> refused{0};
  std::atomic<int> dropped{0};
  std::atomic<int> others{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        crew::asio::async_try_submit(
            pool, io.ioc().get_executor(),
            [] {
              std::this_thread::yield();
              return 1;
            },
            [&](std::exception_ptr e, int v) {
              ++completions;
              if (!e) {
                values += v;
              } else if (code_of(e) == crew::Errc::rejected) {
                ++refused;
              } else if (code_of(e) == crew::Errc::shutdown_dropped) {
                ++dropped;
              } else {
                ++others;
              }
            });
      }
    });
  }
  std::this_thread::sleep_for(2ms);
  (void)pool.shutdown(crew::ShutdownMode::soft, 5s);
  for (auto& t : submitters) t.join();
  const auto deadline = std::chrono::steady_clock::now() + 10s * kSlowdown;
  while (completions.load() < kThreads * kPerThread &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(20ms);  // a second completion would show up here
  EXPECT_EQ(completions.load(), kThreads * kPerThread);
  EXPECT_EQ(others.load(), 0);
  const crew::PoolStats s = pool.stats();
  EXPECT_EQ(static_cast<std::uint64_t>(values.load()), s.outcomes.succeeded);
  EXPECT_EQ(static_cast<std::uint64_t>(refused.load() + dropped.load()), s.outcomes.rejected);
}

}  // namespace

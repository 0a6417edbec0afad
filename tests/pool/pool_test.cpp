// Tests of the core pool: options, submission, task exceptions and stats.
// Admission, workers and lifetime have files of their own
// (pool_admission_test, pool_workers_test, pool_lifetime_test); the
// wake-up policy is the engine's (tests/engine/wake_policy_test.cpp).
#include "crew/pool.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "churn.hpp"
#include "crew/stacktrace.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::Churn;
using test::Gate;
using test::Watchdog;

std::string invalid_message(const PoolOptions& o) {
  try {
    Pool pool(o);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    return e.what();
  }
  return "";
}

TEST(PoolOptions, InvalidValuesAreRejectedWithTheFieldName) {
  EXPECT_NE(invalid_message({.min_workers = 5, .max_workers = 4}).find("min_workers"),
            std::string::npos);
  EXPECT_NE(invalid_message({.name = ""}).find("name"), std::string::npos);
  EXPECT_NE(invalid_message({.max_workers = static_cast<std::size_t>(-1)}).find("max_workers"),
            std::string::npos);
  EXPECT_NE(invalid_message({.idle_timeout = -1s}).find("idle_timeout"), std::string::npos);
  EXPECT_NE(invalid_message({.idle_timeout = 0s}).find("idle_timeout"), std::string::npos);
  EXPECT_NE(invalid_message({.task_timeout = -1ms}).find("task_timeout"), std::string::npos);
  EXPECT_NE(invalid_message({.shutdown_timeout = -1ms}).find("shutdown_timeout"),
            std::string::npos);
  EXPECT_NE(invalid_message({.abandon_grace = -1ms}).find("abandon_grace"), std::string::npos);
  EXPECT_NE(invalid_message({.worker_policy = static_cast<WorkerPolicy>(7)}).find("worker_policy"),
            std::string::npos);
  EXPECT_NE(invalid_message({.overflow = static_cast<Overflow>(7)}).find("overflow"),
            std::string::npos);
  EXPECT_NE(invalid_message({.shutdown_mode = static_cast<ShutdownMode>(7)}).find("shutdown_mode"),
            std::string::npos);
}

// A shutdown mode out of the enum's range is refused, and the pool runs on.
TEST(PoolOptions, ShutdownRefusesAModeOutOfRange) {
  Pool pool({.max_workers = 1});
  try {
    (void)pool.shutdown(static_cast<ShutdownMode>(7), 1s);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("mode 7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.state(), PoolState::running);
  EXPECT_EQ(pool.submit_wait([] { return 4; }), 4);
}

// The scheduling policy a task of `pool` runs under (sched_getscheduler).
int policy_of_a_worker(Pool& pool) {
  Task<int> t = pool.submit([] { return sched_getscheduler(0); });
  return t.get();
}

TEST(PoolOptions, WorkerPolicyIsTheWorkersSchedulingPolicy) {
#if !defined(__linux__)
  GTEST_SKIP() << "WorkerPolicy::batch is SCHED_BATCH, a Linux policy";
#else
  Watchdog dog;
  Pool normal({.name = "normal", .max_workers = 1});
  EXPECT_EQ(policy_of_a_worker(normal), SCHED_OTHER);
  Pool batch({.name = "batch", .max_workers = 1, .worker_policy = WorkerPolicy::batch});
  EXPECT_EQ(policy_of_a_worker(batch), SCHED_BATCH);
  EXPECT_EQ(to_string(WorkerPolicy::batch), "batch");
  // Replacements too: a worker whose start hook throws dies and is replaced.
  std::atomic<int> starts{0};
  Pool replaced({.name = "replaced",
                 .max_workers = 1,
                 .on_worker_start =
                     [&](std::uint64_t) {
                       if (starts.fetch_add(1) == 0) throw std::runtime_error("first start fails");
                     },
                 .worker_policy = WorkerPolicy::batch});
  EXPECT_EQ(policy_of_a_worker(replaced), SCHED_BATCH);
  EXPECT_GE(starts.load(), 2);
#endif
}

TEST(PoolOptions, ZeroMeansTheDocumentedDefaults) {
  Watchdog dog;
  Pool pool;
  const std::size_t cpus = usable_cpus();
  EXPECT_EQ(pool.options().max_workers, 2 * cpus);
  EXPECT_EQ(pool.stats().max_workers, 2 * cpus);
  EXPECT_EQ(pool.options().queue_capacity, 1000 * cpus);
  EXPECT_EQ(pool.name(), "crew");
  EXPECT_EQ(pool.state(), PoolState::running);
}

TEST(PoolSubmit, PostRunsEveryTask) {
  Watchdog dog;
  Pool pool({.max_workers = 4});
  std::atomic<int> ran{0};
  for (int i = 0; i < 10'000; ++i) {
    ASSERT_EQ(pool.post([&ran] { ran.fetch_add(1); }), Admission::accepted);
  }
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(ran.load(), 10'000);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.submitted, 10'000u);
  EXPECT_EQ(s.outcomes.succeeded, 10'000u);
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

TEST(PoolSubmit, LargeCallablesAreBoxedAndStillRun) {
  Watchdog dog;
  Pool pool;
  std::atomic<long> sum{0};
  std::array<long, 32> big{};  // 256 bytes: beyond the inline buffer
  big.fill(1);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(pool.post([big, &sum] {
      long s = 0;
      for (long v : big) s += v;
      sum.fetch_add(s);
    }),
              Admission::accepted);
  }
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(sum.load(), 100 * 32);
}

TEST(PoolSubmit, MoveOnlyCallablesWork) {
  Watchdog dog;
  Pool pool;
  auto owned = std::make_unique<int>(7);
  auto t = pool.submit([p = std::move(owned)] { return *p * 6; });
  EXPECT_EQ(t.get(), 42);
}

TEST(PoolSubmit, SubmitReturnsTheValueOrRethrows) {
  Watchdog dog;
  Pool pool;
  auto ok = pool.submit([] { return std::string("done"); });
  auto bad = pool.submit([]() -> int { throw std::runtime_error("boom"); });
  auto nothing = pool.submit([] {});
  EXPECT_EQ(ok.get(), "done");
  EXPECT_THROW(
      {
        try {
          (void)bad.get();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "boom");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_NO_THROW(nothing.get());
  EXPECT_EQ(ok.status(), TaskStatus::succeeded);
  EXPECT_EQ(bad.status(), TaskStatus::failed);
  EXPECT_NE(ok.id(), bad.id());
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(pool.stats().outcomes.failed, 1u);
}

TEST(PoolSubmit, SubmitWaitReturnsTheResult) {
  Watchdog dog;
  Pool pool;
  EXPECT_EQ(pool.submit_wait([] { return 5; }), 5);
  EXPECT_THROW(pool.submit_wait([]() -> int { throw std::logic_error("x"); }), std::logic_error);
}

TEST(PoolSubmit, WaitForTimesOutOnASlowTask) {
  Watchdog dog;
  Pool pool;
  Gate gate;
  auto t = pool.submit([&gate] { return gate.wait(); });
  EXPECT_FALSE(t.wait_for(20ms));
  EXPECT_FALSE(t.ready());
  gate.open();
  EXPECT_TRUE(t.wait_for(10s));
  EXPECT_TRUE(t.get());
}

TEST(PoolSubmit, AnEmptyHandleThrows) {
  Task<int> t;
  EXPECT_FALSE(t.valid());
  EXPECT_THROW(t.wait(), Error);
  try {
    (void)t.get();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::empty_handle);
  }
}

// One snapshot: every outcome it counts belongs to a submission it counts.
TEST(PoolStats, ASnapshotNeverCountsMoreOutcomesThanSubmissions) {
  Watchdog dog;
  Pool pool({.max_workers = 2});
  Churn churn(pool);
  const auto until = std::chrono::steady_clock::now() + 1s;
  std::uint64_t snapshots = 0;
  while (std::chrono::steady_clock::now() < until) {
    const PoolStats s = pool.stats();
    ++snapshots;
    ASSERT_LE(s.outcomes.total(), s.submitted) << "after " << snapshots << " snapshots";
  }
}

// What on_exception heard: "<task name>:<what()>" per call.
struct SeenExceptions {
  std::mutex mu;
  std::vector<std::string> seen;
  std::function<void(const TaskRef&, std::exception_ptr)> handler() {
    return [this](const TaskRef& task, std::exception_ptr e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        const std::lock_guard lock(mu);
        seen.push_back(task.name + ":" + ex.what());
      }
    };
  }
  bool has(const std::string& entry) {
    const std::lock_guard lock(mu);
    return std::find(seen.begin(), seen.end(), entry) != seen.end();
  }
  std::size_t count() {
    const std::lock_guard lock(mu);
    return seen.size();
  }
};

TEST(PoolExceptions, PostedTaskExceptionsReachTheHandler) {
  Watchdog dog;
  SeenExceptions heard;
  Pool pool({.on_exception = heard.handler()});
  ASSERT_EQ(pool.post([] { throw std::runtime_error("plain"); }), Admission::accepted);
  ASSERT_EQ(pool.post([] { throw std::runtime_error("named"); }, {.name = "job"}),
            Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  ASSERT_EQ(heard.count(), 2u);
  EXPECT_TRUE(heard.has(":plain"));
  EXPECT_TRUE(heard.has("job:named"));
  EXPECT_EQ(pool.stats().outcomes.failed, 2u);
}

// A posted long task that throws after its deadline counts as timed out,
// and what it threw still reaches the handler: nobody else could see it.
TEST(PoolExceptions, ALongTaskThrowingAfterItsDeadlineStillReportsTheException) {
  Watchdog dog;
  SeenExceptions heard;
  Pool pool({.max_workers = 2, .on_exception = heard.handler()});
  auto throw_when_stopped = [](const std::string& what) {
    return [what](std::stop_token stop) {
      while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
      throw std::runtime_error(what);
    };
  };
  ASSERT_EQ(pool.post(throw_when_stopped("unnamed"), {.timeout = 20ms}), Admission::accepted);
  ASSERT_EQ(pool.post(throw_when_stopped("named"), {.name = "job", .timeout = 20ms}),
            Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  ASSERT_EQ(heard.count(), 2u);
  EXPECT_TRUE(heard.has(":unnamed"));
  EXPECT_TRUE(heard.has("job:named"));
  EXPECT_EQ(pool.stats().outcomes.timed_out, 2u);
  EXPECT_EQ(pool.stats().outcomes.failed, 0u);
}

TEST(PoolExceptions, WithoutAHandlerTheyGoToStderrWithTheTaskName) {
  Watchdog dog;
  testing::internal::CaptureStderr();
  {
    Pool pool({.name = "errpool"});
    ASSERT_EQ(pool.post([] { throw std::runtime_error("lost?"); }, {.name = "reindex"}),
              Admission::accepted);
    ASSERT_TRUE(pool.wait_idle(10s));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("errpool"), std::string::npos) << err;
  EXPECT_NE(err.find("reindex"), std::string::npos) << err;
  EXPECT_NE(err.find("lost?"), std::string::npos) << err;
  // This binary does not link crew::stacktrace: no trace, and nothing
  // recorded the throw (stacktrace_test checks the other side).
  EXPECT_EQ(err.find("thrown at"), std::string::npos) << err;
}

TEST(PoolExceptions, WithoutCrewStacktraceThrowTraceIsEmpty) {
  try {
    throw std::runtime_error("here");
  } catch (...) {
    EXPECT_EQ(throw_trace(std::current_exception()), "");
  }
}

}  // namespace
}  // namespace crew

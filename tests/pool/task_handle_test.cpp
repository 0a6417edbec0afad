// Tests of what a task's handle owns and shows: the ownership of the task's
// state and result, deadlines at the ends of the clock's range, the task's
// queue wait and run time, and the caller's correlation id.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "crew/detail/deadline.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "crew/task.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::Watchdog;

// A task state is freed by whichever holder lets go last: the handle, or
// the thread that ran it (which publishes the outcome and drops the queue's
// reference in one step when nobody is parked on the task, in two when
// somebody is). The callable's captures die with the state, so a token's
// use count tells when it was freed.
TEST(Ownership, TheLastHolderFreesTheStateWhoeverItIs) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  auto token = std::make_shared<int>(0);
  auto freed = [&token] { return eventually([&token] { return token.use_count() == 1; }); };

  // The handle goes first, while the task is queued behind a blocked one.
  Gate gate;
  auto blocker = pool.submit([&gate] { EXPECT_TRUE(gate.wait()); });
  (void)pool.submit([token] { (void)token; });
  EXPECT_EQ(token.use_count(), 2);
  gate.open();
  blocker.get();
  EXPECT_TRUE(freed());

  // The runner goes first; the handle frees the state.
  {
    auto t = pool.submit([token] { return *token + 1; });
    EXPECT_EQ(t.get(), 1);
  }
  EXPECT_TRUE(freed());

  // A failure keeps the state (and its exception) until the handle goes.
  {
    auto t = pool.submit([token]() -> int { throw std::runtime_error("no"); });
    t.wait();
    EXPECT_EQ(t.status(), TaskStatus::failed);
    EXPECT_THROW(t.get(), std::runtime_error);
  }
  EXPECT_TRUE(freed());

  // Another thread is parked in get() when the task finishes.
  {
    Gate running;
    auto t = pool.submit([token, &running] { EXPECT_TRUE(running.wait()); });
    std::thread waiter([&t] { t.get(); });
    std::this_thread::sleep_for(20ms);  // past get()'s polling, into its futex wait
    running.open();
    waiter.join();
    EXPECT_EQ(t.status(), TaskStatus::succeeded);
  }
  EXPECT_TRUE(freed());

  // Fork-join: children submitted and waited for from a worker, most of
  // them run by the parent's own wait.
  pool.submit([&pool, token] {
        std::vector<Task<int>> children;
        for (int i = 0; i < 100; ++i) children.push_back(pool.submit([token, i] { return i; }));
        int sum = 0;
        for (auto& c : children) sum += c.get();
        EXPECT_EQ(sum, 4950);
      })
      .get();
  EXPECT_TRUE(freed());
}

// A result counting its live copies; Align > alignof(void*) takes the
// states' over-aligned allocation path.
template <std::size_t Align>
struct alignas(Align) CountedResult {
  explicit CountedResult(std::atomic<int>* l) : live(l) { live->fetch_add(1); }
  CountedResult(CountedResult&& o) noexcept : live(o.live) { live->fetch_add(1); }
  CountedResult(const CountedResult&) = delete;
  CountedResult& operator=(const CountedResult&) = delete;
  CountedResult& operator=(CountedResult&&) = delete;
  ~CountedResult() { live->fetch_sub(1); }
  std::atomic<int>* live;
};

template <std::size_t Align>
void expect_results_destroyed_once() {
  using R = CountedResult<Align>;
  Pool pool({.max_workers = 1});
  std::atomic<int> live{0};
  auto none_live = [&live] { return eventually([&live] { return live.load() == 0; }); };

  // get() moves the result out; the moved-from one goes with the state.
  {
    auto t = pool.submit([&live] { return R(&live); });
    const R r = t.get();
    EXPECT_EQ(r.live, &live);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(&r) % Align, 0u);
    EXPECT_EQ(live.load(), 2);
  }
  EXPECT_TRUE(none_live());

  // Never taken: destroyed with the state.
  {
    auto t = pool.submit([&live] { return R(&live); });
    t.wait();
    EXPECT_EQ(live.load(), 1);
  }
  EXPECT_TRUE(none_live());

  // The handle goes while the task is queued; the runner builds the result
  // and frees it with the state.
  Gate gate;
  auto blocker = pool.submit([&gate] { EXPECT_TRUE(gate.wait()); });
  (void)pool.submit([&live] { return R(&live); });
  gate.open();
  blocker.get();
  EXPECT_TRUE(none_live());

  // A task that failed or never ran has no result to destroy.
  {
    auto failed = pool.submit([]() -> R { throw std::runtime_error("no"); });
    EXPECT_THROW((void)failed.get(), std::runtime_error);
    Gate hold;
    auto blocker2 = pool.submit([&hold] { EXPECT_TRUE(hold.wait()); });
    auto cancelled = pool.submit([&live] { return R(&live); });
    EXPECT_EQ(cancelled.cancel(), CancelResult::cancelled);
    hold.open();
    blocker2.get();
    EXPECT_THROW((void)cancelled.get(), Error);
    EXPECT_EQ(live.load(), 0);
  }
}

TEST(Ownership, AResultIsDestroyedOnceWhetherOrNotGetTookIt) {
  Watchdog dog;
  expect_results_destroyed_once<alignof(void*)>();
  expect_results_destroyed_once<64>();
}

// The common state, a short task with a handle and a word-sized result, is
// 80 bytes (a 96-byte block from the allocator): a name, deadlines and a
// long task's runner link sit in Extras, a block of their own. A field added
// to TaskStateBase shows up here.
TEST(Ownership, AShortTaskWithAHandleKeepsItsStateWithinEightyBytes) {
  auto f = []() noexcept { return std::uint64_t{1}; };
  EXPECT_LE(sizeof(detail::TaskState<std::uint64_t, decltype(f)>), 80u);
  Pool pool({.max_workers = 1});
  auto plain = pool.submit(f);
  EXPECT_EQ(plain.state()->extras(), nullptr);
  auto named = pool.submit(f, {.name = "n"});
  ASSERT_NE(named.state()->extras(), nullptr);
  EXPECT_EQ(named.name(), "n");
  EXPECT_EQ(plain.get() + named.get(), 2u);
}

TEST(Outcome, LegalTaskTransitionsAreExactlyTheDocumentedOnes) {
  using S = TaskStatus;
  const S all[] = {S::queued,    S::running,   S::succeeded, S::failed,
                   S::cancelled, S::timed_out, S::rejected};
  int legal = 0;
  for (S from : all) {
    for (S to : all) legal += is_legal_transition(from, to) ? 1 : 0;
  }
  EXPECT_EQ(legal, 3 + 4);
  EXPECT_TRUE(is_legal_transition(S::queued, S::rejected));
  EXPECT_FALSE(is_legal_transition(S::running, S::rejected));
  EXPECT_FALSE(is_legal_transition(S::succeeded, S::failed));
  for (S s : all) EXPECT_FALSE(to_string(s).empty());
}

// Deadlines are "now + timeout": the largest timeouts must mean "no deadline",
// not an overflowed sum (undefined behaviour, caught by UBSan; in practice a
// deadline in the past).
TEST(Deadlines, WaitForTheLargestDurationsWaitsForTheOutcome) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  Gate gate;
  auto t = pool.submit([&gate] {
    gate.wait();
    return 7;
  });
  std::thread opener([&gate] {
    std::this_thread::sleep_for(30ms);
    gate.open();
  });
  EXPECT_TRUE(t.wait_for(std::chrono::nanoseconds::max()));
  EXPECT_TRUE(t.wait_for(std::chrono::hours::max()));  // does not even fit in nanoseconds
  opener.join();
  EXPECT_EQ(t.get(), 7);
}

TEST(Deadlines, ATaskTimeoutAtTheMaximumNeverExpires) {
  Watchdog dog;
  Pool pool({.max_workers = 2, .task_timeout = std::chrono::nanoseconds::max()});
  auto long_running = [](std::stop_token stop) {
    std::this_thread::sleep_for(30ms);
    return !stop.stop_requested();
  };
  // A task state (handle), and an inline fire-and-forget long task: two paths.
  auto handle = pool.submit(long_running);
  std::atomic<int> inline_result{-1};
  ASSERT_EQ(pool.post([&](std::stop_token stop) { inline_result = long_running(stop) ? 1 : 0; }),
            Admission::accepted);
  auto own = pool.submit(long_running, {.timeout = std::chrono::nanoseconds::max() - 1ns});
  EXPECT_TRUE(handle.get());
  EXPECT_TRUE(own.get());
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(inline_result.load(), 1);
  EXPECT_EQ(pool.stats().outcomes.timed_out, 0u);
}

TEST(Deadlines, AQueueTimeoutAtTheMaximumNeverExpires) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  pool.pause();
  auto t = pool.submit([] { return 1; }, {.queue_timeout = std::chrono::nanoseconds::max()});
  std::this_thread::sleep_for(30ms);  // the supervisor would have fired a wrapped deadline
  EXPECT_EQ(t.status(), TaskStatus::queued);
  pool.resume();
  EXPECT_EQ(t.get(), 1);
}

TEST(Deadlines, AnAbandonGraceAtTheMaximumNeverWritesATaskOff) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .abandon_grace = std::chrono::nanoseconds::max()});
  // Ignores its stop token for a while after its deadline, then returns.
  auto t = pool.submit(
      [](std::stop_token stop) {
        while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(50ms);
        return 0;
      },
      {.timeout = 10ms});
  t.wait();
  EXPECT_EQ(t.status(), TaskStatus::timed_out);
  EXPECT_EQ(t.reason(), Errc::timed_out);  // not abandoned
  EXPECT_EQ(pool.stats().abandoned, 0u);
}

TEST(Deadlines, AnIdleTimeoutAtTheMaximumKeepsIdleWorkers) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .idle_timeout = std::chrono::nanoseconds::max()});
  ASSERT_EQ(pool.submit([] { return 0; }).get(), 0);
  ASSERT_TRUE(eventually([&pool] { return pool.stats().idle == 1; }));
  std::this_thread::sleep_for(50ms);  // past the spin phase, asleep
  EXPECT_EQ(pool.stats().workers, 1u);
}

TEST(Deadlines, SaturatingDeadlinesClampToTheClocksRange) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(detail::saturating_deadline(now, std::chrono::nanoseconds::max()),
            Clock::time_point::max());
  EXPECT_EQ(detail::saturating_deadline(now, std::chrono::hours::max()), Clock::time_point::max());
  EXPECT_EQ(detail::saturating_deadline(Clock::time_point::min() + 1ns, -5ms),
            Clock::time_point::min());
  EXPECT_EQ(detail::saturating_deadline(now, 5ms), now + 5ms);
  EXPECT_EQ(detail::saturating_deadline(now, -5ms), now - 5ms);
  EXPECT_EQ(detail::saturating_add(INT64_MAX - 1, 2), INT64_MAX);
  EXPECT_EQ(detail::saturating_add(INT64_MIN + 1, -2), INT64_MIN);
  EXPECT_EQ(detail::saturating_add(40, 2), 42);
}

// ---- durations on the handle ----

TEST(TaskTimes, AHandleShowsItsQueueWaitAndRunTimeOnceItEnded) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .time_tasks = true});
  pool.pause();  // the task waits in the queue until resume()
  auto t = pool.submit([] { std::this_thread::sleep_for(50ms); });
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(t.queue_wait(), 0ns);  // not known before the outcome
  EXPECT_EQ(t.run_time(), 0ns);
  pool.resume();
  t.get();
  EXPECT_GE(t.queue_wait(), 30ms);
  EXPECT_LT(t.queue_wait(), 30ms + 5s * test::kSlowdown);
  EXPECT_GE(t.run_time(), 50ms);
  EXPECT_LT(t.run_time(), 50ms + 5s * test::kSlowdown);
  EXPECT_EQ(Task<int>().queue_wait(), 0ns);  // an empty handle
}

TEST(TaskTimes, ATaskCancelledInTheQueueWaitedUntilItsCancelAndNeverRan) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .time_tasks = true});
  pool.pause();
  auto t = pool.submit([] { return 1; });
  std::this_thread::sleep_for(20ms);
  ASSERT_EQ(t.cancel(), CancelResult::cancelled);
  EXPECT_GE(t.queue_wait(), 20ms);
  EXPECT_EQ(t.run_time(), 0ns);
  pool.resume();
}

TEST(TaskTimes, AWrittenOffTaskRanUntilItWasWrittenOff) {
  Watchdog dog;
  auto gate = std::make_shared<Gate>();
  {
    Pool pool({.max_workers = 1, .abandon_grace = 20ms, .time_tasks = true});
    auto t = pool.submit([gate](std::stop_token) { gate->wait(); }, {.timeout = 10ms});
    ASSERT_TRUE(t.wait_for(10s * test::kSlowdown));
    EXPECT_EQ(t.reason(), Errc::abandoned);
    EXPECT_GE(t.run_time(), 30ms);  // its deadline, then the grace
    gate->open();
  }
}

// A run right after another on the same worker takes that one's end as
// its start, unless the worker waited in between: here for a pause.
TEST(TaskTimes, ARunAfterAPauseIsNotTimedFromThePreviousEnd) {
  Watchdog dog;
  Pool pool({.max_workers = 1, .time_tasks = true});
  Gate gate;
  auto first = pool.submit([&gate] { (void)gate.wait(); });
  auto second = pool.submit([] {});
  ASSERT_TRUE(eventually([&] { return first.status() == TaskStatus::running; }));
  pool.pause();
  gate.open();
  first.get();
  std::this_thread::sleep_for(50ms);
  pool.resume();
  second.get();
  EXPECT_GE(second.queue_wait(), 50ms);
  EXPECT_LT(second.run_time(), second.queue_wait());
}

// Off by default: the handle shows 0 and the pool reads no clock for it
// (the enqueue time stays 0). An observer that wants timings makes the
// pool read the clock anyway, and then the handle shows them.
TEST(TaskTimes, OnlyAPoolThatTimesItsTasksShowsThem) {
  Watchdog dog;
  const auto sleeper = [] { std::this_thread::sleep_for(20ms); };
  {
    Pool pool({.max_workers = 1});
    auto t = pool.submit(sleeper);
    EXPECT_EQ(t.state()->clock.enqueued_ns(), 0);
    t.get();
    EXPECT_EQ(t.run_time(), 0ns);
    EXPECT_EQ(t.queue_wait(), 0ns);
  }
  struct Timing final : Observer {
    std::uint32_t events() const noexcept override { return task_finished; }
  };
  Pool observed({.max_workers = 1, .observers = {std::make_shared<Timing>()}});
  auto t = observed.submit(sleeper);
  t.get();
  EXPECT_GE(t.run_time(), 20ms);
}

// The overload controller times the queue waits it samples (every task
// while a pool starts few), but keeps them to itself: a handle shows its
// durations only where the pool was asked for them.
TEST(TaskTimes, TheOverloadControllersSamplesDoNotShowOnTheHandle) {
  Watchdog dog;
  const auto sleeper = [] { std::this_thread::sleep_for(20ms); };
  PoolOptions o{.max_workers = 1};
  o.overload.enabled = true;
  {
    Pool pool(o);
    auto t = pool.submit(sleeper);
    EXPECT_NE(t.state()->clock.enqueued_ns(), 0);  // sampled
    t.get();
    EXPECT_EQ(t.run_time(), 0ns);
    EXPECT_EQ(t.queue_wait(), 0ns);
  }
  o.time_tasks = true;
  Pool timed(o);
  auto t = timed.submit(sleeper);
  t.get();
  EXPECT_GE(t.run_time(), 20ms);
}

// The word holds two durations of 31 bits: exact below 2^26 ns, then 26
// significant bits, saturating at (2^26 - 1) << 31 ns.
TEST(TaskTimes, TheClockWordKeepsBothDurationsToTwentySixBits) {
  const auto times = [](std::int64_t wait, std::int64_t run) {
    detail::TaskClock c;
    c.set_enqueued(1000);
    EXPECT_EQ(c.enqueued_ns(), 1000);
    c.record(1000 + wait, 1000 + wait + run);
    EXPECT_EQ(c.enqueued_ns(), 0);
    return std::pair{c.queue_wait().count(), c.run_time().count()};
  };
  EXPECT_EQ(times(0, 0), (std::pair<std::int64_t, std::int64_t>{0, 0}));
  EXPECT_EQ(times(12'345, 67'108'863), (std::pair<std::int64_t, std::int64_t>{12'345, 67'108'863}));
  const std::int64_t hour = 3'600'000'000'000;
  const auto [wait, run] = times(hour + 12'345, 3 * hour + 1);
  EXPECT_LE(wait, hour + 12'345);
  EXPECT_GE(wait, hour + 12'345 - ((hour + 12'345) >> 25));
  EXPECT_LE(run, 3 * hour + 1);
  EXPECT_GE(run, 3 * hour - ((3 * hour) >> 25));
  const std::int64_t most = ((std::int64_t{1} << 26) - 1) << 31;
  EXPECT_EQ(times(std::int64_t{1} << 62, 5).first, most);
  detail::TaskClock unclocked;
  unclocked.record(10, 20);  // never enqueued with a time: nothing recorded
  EXPECT_EQ(unclocked.run_time(), 0ns);
  detail::TaskClock unshown;  // timed for the overload controller alone
  unshown.set_enqueued(1000, /*shown=*/false);
  EXPECT_EQ(unshown.enqueued_ns(), 1000);
  unshown.record(2000, 5000);
  EXPECT_EQ(unshown.enqueued_ns(), 0);
  EXPECT_EQ(unshown.queue_wait(), 0ns);
  EXPECT_EQ(unshown.run_time(), 0ns);
}

// ---- the caller's correlation id ----

TEST(CorrelationId, TheTaskAndItsHandleCarryIt) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  auto t = pool.submit([](const TaskContext& ctx) { return std::string(ctx.correlation_id); },
                       {.correlation_id = "req-42"});
  EXPECT_EQ(t.correlation_id(), "req-42");
  EXPECT_EQ(t.get(), "req-42");
  auto plain = pool.submit([] { return 1; });
  EXPECT_EQ(plain.correlation_id(), "");
  EXPECT_EQ(plain.state()->extras(), nullptr);  // no id, no Extras
  EXPECT_EQ(plain.get(), 1);
}

TEST(CorrelationId, OneLongerThanTheBoundIsRefusedWithANamedError) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  const std::string longest(kMaxCorrelationId, 'x');
  EXPECT_EQ(pool.submit([] { return 1; }, {.correlation_id = longest}).get(), 1);
  try {
    (void)pool.post([] {}, {.correlation_id = longest + "y"});
    FAIL() << "a 65-byte correlation id was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("TaskOptions.correlation_id"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)pool.submit([] {}, {.correlation_id = longest + "y"}), Error);
  EXPECT_EQ(pool.stats().submitted, 1u);  // the refused ones never entered
}

TEST(CorrelationId, TheWorkerSnapshotShowsTheRunningTasksId) {
  Watchdog dog;
  Pool pool({.max_workers = 1});
  Gate gate;
  std::atomic<bool> running{false};
  ASSERT_EQ(pool.post(
                [&] {
                  running = true;
                  gate.wait();
                },
                {.correlation_id = "req-7"}),
            Admission::accepted);
  ASSERT_TRUE(eventually([&] { return running.load(); }));
  const std::vector<WorkerInfo> workers = pool.workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].task.correlation_id, "req-7");
  EXPECT_NE(workers[0].task.id, 0u);
  gate.open();
  ASSERT_TRUE(pool.wait_idle(10s));
}

TEST(CorrelationId, TheShutdownReportAndTheExceptionHandlerNameIt) {
  Watchdog dog;
  std::mutex mu;
  std::vector<TaskRef> threw;
  Pool pool({.max_workers = 1, .on_exception = [&](const TaskRef& t, std::exception_ptr) {
               const std::lock_guard lock(mu);
               threw.push_back(t);
             }});
  ASSERT_EQ(pool.post([] { throw std::runtime_error("x"); }, {.correlation_id = "req-thrower"}),
            Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  {
    const std::lock_guard lock(mu);
    ASSERT_EQ(threw.size(), 1u);
    EXPECT_EQ(threw[0].correlation_id, "req-thrower");
  }
  pool.pause();
  ASSERT_EQ(pool.post([] {}, {.correlation_id = "req-dropped"}), Admission::accepted);
  const ShutdownReport r = pool.shutdown(ShutdownMode::soft, 10s);
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_EQ(r.rejected[0].correlation_id, "req-dropped");
}

}  // namespace
}  // namespace crew

// Tests of crew::FuncPool: the handler, zero-allocation invokes, and the
// pool's options, shutdown modes, observers and stats.
#include "crew/func_pool.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "replaced_new.hpp"  // operator new: counts allocations, fails one on demand
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::Watchdog;

PoolOptions workers(std::size_t n) { return test::fixed_workers("func-pool-test", n); }

struct Args32 {
  std::array<std::uint64_t, 4> v{};
};
struct Args64 {
  std::array<std::uint64_t, 8> v{};
};

static_assert(FuncPool<std::uint64_t>::kInlineArg);
static_assert(FuncPool<Args32>::kInlineArg);
static_assert(FuncPool<std::array<std::uint64_t, 5>>::kInlineArg);  // 40 bytes
static_assert(!FuncPool<Args64>::kInlineArg);

TEST(FuncPool, RunsTheHandlerWithEveryArgument) {
  Watchdog dog;
  std::atomic<std::uint64_t> sum{0};
  FuncPool<std::uint64_t> fp(workers(2), [&sum](std::uint64_t x) { sum.fetch_add(x); });
  for (std::uint64_t i = 1; i <= 1000; ++i) ASSERT_EQ(fp.invoke(i), Admission::accepted);
  ASSERT_TRUE(fp.wait_idle(5s));
  EXPECT_EQ(sum.load(), 1000u * 1001 / 2);
  const PoolStats s = fp.stats();
  EXPECT_EQ(s.outcomes.succeeded, 1000u);
  EXPECT_EQ(s.submitted, 1000u);
  EXPECT_EQ(fp.name(), "func-pool-test");
}

TEST(FuncPool, InvokeMakesNoHeapAllocationForAnArgumentThatFitsTheSlot) {
  Watchdog dog;
  std::atomic<std::uint64_t> done{0};
  FuncPool<Args32> fp(
      workers(2), [&done](const Args32& a) { done.fetch_add(a.v[0], std::memory_order_release); });
  // Warm up: workers started, and both once asleep at the same time (the
  // pool's list of sleepers gets its capacity then).
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(fp.invoke(Args32{{1, 2, 3, 4}}), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return done.load() == 1000; }));
  ASSERT_TRUE(fp.wait_idle(5s));
  ASSERT_TRUE(eventually([&] { return fp.stats().idle == 2; }));
  std::this_thread::sleep_for(20ms);
  const std::uint64_t before = test::g_allocations.load();
  constexpr std::uint64_t kCalls = 20'000;
  for (std::uint64_t i = 0; i < kCalls; ++i) {
    ASSERT_EQ(fp.invoke(Args32{{1, 2, 3, 4}}), Admission::accepted);
    if (i % 4096 == 4095) {  // stay within the queue's preallocated ring
      ASSERT_TRUE(eventually([&] { return done.load() == 1000 + i + 1; }));
    }
  }
  ASSERT_TRUE(eventually([&] { return done.load() == 1000 + kCalls; }));
  EXPECT_EQ(test::g_allocations.load() - before, 0u);
}

TEST(FuncPool, ALargeArgumentIsBoxedAndStillDelivered) {
  Watchdog dog;
  std::atomic<std::uint64_t> sum{0};
  FuncPool<Args64> fp(workers(1), [&sum](Args64 a) { sum.fetch_add(a.v[7]); });
  for (int i = 0; i < 100; ++i) {
    Args64 a;
    a.v[7] = 2;
    ASSERT_EQ(fp.invoke(a), Admission::accepted);
  }
  ASSERT_TRUE(fp.wait_idle(5s));
  EXPECT_EQ(sum.load(), 200u);
}

TEST(FuncPool, MoveOnlyArgumentsAreMovedToTheHandler) {
  Watchdog dog;
  std::atomic<int> sum{0};
  FuncPool<std::unique_ptr<int>> fp(workers(1), [&sum](std::unique_ptr<int> p) { sum += *p; });
  for (int i = 0; i < 10; ++i) ASSERT_EQ(fp.invoke(std::make_unique<int>(i)), Admission::accepted);
  ASSERT_TRUE(fp.wait_idle(5s));
  EXPECT_EQ(sum.load(), 45);
}

TEST(FuncPool, HandlerExceptionsGoToOnExceptionAndCountAsFailed) {
  Watchdog dog;
  std::atomic<int> reported{0};
  PoolOptions o = workers(1);
  o.on_exception = [&reported](const TaskRef&, std::exception_ptr) { reported.fetch_add(1); };
  FuncPool<int> fp(std::move(o), [](int x) {
    if (x % 2 == 0) throw std::runtime_error("even");
  });
  for (int i = 0; i < 10; ++i) ASSERT_EQ(fp.invoke(i), Admission::accepted);
  ASSERT_TRUE(fp.wait_idle(5s));
  EXPECT_EQ(reported.load(), 5);
  EXPECT_EQ(fp.stats().outcomes.failed, 5u);
  EXPECT_EQ(fp.stats().outcomes.succeeded, 5u);
}

TEST(FuncPool, SoftShutdownRejectsQueuedInvocationsAndReportsThem) {
  Watchdog dog;
  Gate release;
  std::atomic<bool> started{false};
  std::atomic<int> ran{0};
  FuncPool<int> fp(workers(1), [&](int x) {
    if (x == 0) {
      started = true;
      release.wait();
    }
    ran.fetch_add(1);
  });
  ASSERT_EQ(fp.invoke(0), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  for (int i = 1; i <= 5; ++i) ASSERT_EQ(fp.invoke(i), Admission::accepted);
  ASSERT_EQ(fp.invoke(6, {.name = "named"}), Admission::accepted);
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    release.open();
  });
  const ShutdownReport r = fp.shutdown(ShutdownMode::soft, 0ns);
  opener.join();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(r.rejected_unnamed, 5u);
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_EQ(r.rejected[0].name, "named");
  EXPECT_EQ(r.lifetime.rejected, 6u);
  EXPECT_EQ(fp.state(), PoolState::stopped);
  EXPECT_EQ(fp.invoke(7), Admission::closed);
  EXPECT_TRUE(fp.restart());
  ASSERT_EQ(fp.invoke(8), Admission::accepted);
  ASSERT_TRUE(fp.wait_idle(5s));
  EXPECT_EQ(ran.load(), 2);
}

TEST(FuncPool, TryInvokeRefusesWhenTheQueueIsFull) {
  Watchdog dog;
  PoolOptions o = workers(1);
  o.min_workers = 0;  // no worker yet: pause() holds every task in the queue
  o.queue_capacity = 2;
  o.queue_shards = 1;
  FuncPool<int> fp(std::move(o), [](int) {});
  fp.pause();
  EXPECT_EQ(fp.try_invoke(1), Admission::accepted);
  EXPECT_EQ(fp.try_invoke(2), Admission::accepted);
  EXPECT_EQ(fp.try_invoke(3), Admission::full);
  fp.resume();
  ASSERT_TRUE(fp.wait_idle(5s));
  EXPECT_EQ(fp.stats().outcomes.succeeded, 2u);
}

class CountingObserver : public Observer {
 public:
  [[nodiscard]] std::uint32_t events() const noexcept override {
    return Observer::task_enqueued | Observer::task_finished;
  }
  void on_task_enqueued(const TaskEvent&) noexcept override { enqueued.fetch_add(1); }
  void on_task_finished(const TaskEvent&, TaskStatus outcome, std::chrono::nanoseconds,
                        std::chrono::nanoseconds) noexcept override {
    if (outcome == TaskStatus::succeeded) succeeded.fetch_add(1);
  }
  std::atomic<int> enqueued{0};
  std::atomic<int> succeeded{0};
};

TEST(FuncPool, ObserversSeeEveryInvokeWithoutAllocationsFor32ByteArguments) {
  Watchdog dog;
  auto observer = std::make_shared<CountingObserver>();
  PoolOptions o = workers(1);
  o.observers.push_back(observer);
  std::atomic<std::uint64_t> done{0};
  FuncPool<Args32> fp(std::move(o), [&done](const Args32&) { done.fetch_add(1); });
  for (int i = 0; i < 100; ++i) ASSERT_EQ(fp.invoke(Args32{}), Admission::accepted);
  ASSERT_TRUE(fp.wait_idle(5s));
  std::this_thread::sleep_for(20ms);  // the worker asleep once: see above
  const std::uint64_t before = test::g_allocations.load();
  // In batches, so that the queue stays within its preallocated ring.
  for (std::uint64_t batch = 1; batch <= 10; ++batch) {
    for (int i = 0; i < 100; ++i) ASSERT_EQ(fp.invoke(Args32{}), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return done.load() == 100 + 100 * batch; }));
  }
  EXPECT_EQ(test::g_allocations.load() - before, 0u);
  ASSERT_TRUE(fp.wait_idle(5s));
  EXPECT_EQ(observer->enqueued.load(), 1100);
  EXPECT_EQ(observer->succeeded.load(), 1100);
}

TEST(FuncPool, AHandlerThatInvokesAgainNeverDeadlocksAFullQueue) {
  Watchdog dog;
  PoolOptions o = workers(1);
  o.queue_capacity = 1;
  o.queue_shards = 1;
  std::atomic<int> calls{0};
  FuncPool<int>* self = nullptr;
  FuncPool<int> fp(std::move(o), [&](int depth) {
    calls.fetch_add(1);
    // From the worker, a full queue runs the call inline instead of blocking.
    if (depth < 20) (void)self->invoke(depth + 1);
    if (depth < 20) (void)self->invoke(depth + 1);
  });
  self = &fp;
  ASSERT_EQ(fp.invoke(18), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return calls.load() == 7; }));
  ASSERT_TRUE(fp.wait_idle(5s));
}

TEST(FuncPool, AnEmptyHandlerOrBadOptionsAreRejectedByName) {
  try {
    FuncPool<int> fp(workers(1), std::function<void(int)>{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("handler"), std::string::npos);
  }
  PoolOptions bad;
  bad.min_workers = 4;
  bad.max_workers = 2;
  try {
    FuncPool<int> fp(std::move(bad), [](int) {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
    EXPECT_NE(std::string(e.what()).find("min_workers"), std::string::npos);
  }
}

TEST(FuncPool, TakesAnyCallableAsHandler) {
  Watchdog dog;
  struct Add {
    std::atomic<int>* sum;
    void operator()(int x) const { sum->fetch_add(x); }
  };
  std::atomic<int> sum{0};
  FuncPool<int> by_struct(workers(1), Add{&sum});
  std::function<void(int)> fn = [&sum](int x) { sum.fetch_add(100 * x); };
  FuncPool<int> by_function(workers(1), fn);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(by_struct.invoke(i), Admission::accepted);
    ASSERT_EQ(by_function.invoke(i), Admission::accepted);
  }
  ASSERT_TRUE(by_struct.wait_idle(5s));
  ASSERT_TRUE(by_function.wait_idle(5s));
  EXPECT_EQ(sum.load(), 45 + 4500);
}

}  // namespace
}  // namespace crew

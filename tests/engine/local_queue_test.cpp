// Tests of the worker-local queues (crew/detail/local_queue.hpp): the
// deque itself, an owner racing two thieves with light and with full
// fences; and, in a pool, the tasks a stopped worker leaves behind, and
// stealing while pause(), resume() and resize() race it.
#include "crew/detail/local_queue.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/detail/local_queues.hpp"
#include "crew/pool.hpp"
#include "fork_join_util.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::fib_calls;
using test::fib_group;
using test::fib_serial;
using test::fib_task;
using test::Gate;
using test::kSanitized;
using test::StackProbe;
using test::Watchdog;

// A worker stopped between tasks leaves forked tasks in its local queue;
// the others steal them, and nothing is lost.
TEST(LocalQueues, TasksLeftByAStoppedWorkerAreStolen) {
  Watchdog dog;
  PoolOptions o = test::fixed_workers("left-behind", 2);
  o.min_workers = 1;
  Pool pool(std::move(o));
  std::atomic<int> ran{0};
  Gate forked;
  Gate release;
  std::atomic<std::uint64_t> forker{0};
  Task<void> parent = pool.submit([&] {
    for (const WorkerInfo& w : pool.workers()) {
      if (w.state == WorkerState::busy) forker = w.id;
    }
    for (int i = 0; i < 100; ++i) (void)pool.post([&ran] { ran.fetch_add(1); });
    forked.open();
    release.wait();
  });
  ASSERT_TRUE(forked.wait());
  ASSERT_NE(forker.load(), 0u);
  // Its children may be stolen by the second worker already; stop the
  // forker, then let its task return: it exits with what is left.
  ASSERT_TRUE(pool.stop_worker(forker.load(), WorkerStop::graceful));
  release.open();
  parent.wait();
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(ran.load(), 100);
}

// Recursion with stealing while another thread pauses, resumes and
// resizes the pool: results and outcome counts stay exact.
TEST(LocalQueues, StealingSurvivesRacingPauseResumeAndResize) {
  Watchdog dog(90s);
  PoolOptions o = test::fixed_workers("racing", 2);
  o.min_workers = 1;
  o.max_workers = 4;
  StackProbe probe;
  Pool pool(probe.attach(std::move(o)));
  std::atomic<bool> stop{false};
  std::thread chaos([&] {
    std::size_t size = 1;
    while (!stop.load()) {
      pool.pause();
      std::this_thread::sleep_for(200us);
      pool.resume();
      pool.resize(size);
      size = size % 4 + 1;
      std::this_thread::sleep_for(300us);
    }
    pool.resize(4);
  });
  const int rounds = kSanitized ? 3 : 20;
  const int n = kSanitized ? 14 : 18;
  for (int r = 0; r < rounds; ++r) {
    const bool by_task = r % 2 == 1;
    const std::uint64_t got = pool.submit_wait(
        [&] { return by_task ? fib_task(pool, probe, n) : fib_group(pool, probe, n); });
    ASSERT_EQ(got, fib_serial(n)) << "round " << r;
  }
  stop = true;
  chaos.join();
  ASSERT_TRUE(pool.wait_idle(30s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.succeeded, static_cast<std::uint64_t>(rounds) * fib_calls(n));
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  // The Task rounds leave cells of tasks a waiting worker ran itself; the
  // idle workers drop them.
  EXPECT_TRUE(eventually([&] { return pool.stats().queued == 0; }));
}

// The deque itself: an owner pushing and popping races two thieves, with
// light pops (the default, while steals are rare) and after thieves have
// switched it to full fences. Every cell is taken exactly once.
class LocalQueueRace : public ::testing::TestWithParam<bool> {};

TEST_P(LocalQueueRace, EveryCellIsTakenExactlyOnce) {
  using crew::detail::Cell;
  using crew::detail::LocalQueue;
  Watchdog dog(60s);
  crew::detail::enable_light_fences();
  const bool switch_to_fences = GetParam();
  // Switched: 4 heavy steals in the whole run (a loaded machine may
  // schedule the thieves less than once a millisecond) switch the queue.
  constexpr std::int64_t kWholeRun = std::int64_t{3600} * 1'000'000'000;
  LocalQueue q(switch_to_fences ? 4 : UINT32_MAX, kWholeRun);
  // At least n cells; more (up to `most`, for at most 20 s) while the
  // thieves have stolen nothing yet or not switched the queue: on a loaded
  // machine they may not have run at all by then. `most` is the same in
  // sanitizer builds, where n is smaller: an owner that pushes a cell in
  // 100 ns used up 16n = 320,000 cells in 30 ms once, under ASan with
  // ctest -j2, before the thieves had made the 4 steals that switch it.
  const std::size_t n = kSanitized ? 20'000 : 400'000;
  constexpr std::size_t most = 6'400'000;
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  std::vector<std::atomic<std::uint8_t>> taken(most);
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> stolen{0};
  auto thief = [&] {
    Cell c;
    while (!done.load(std::memory_order_acquire)) {
      if (q.try_steal(c)) {
        (void)c.invoke_and_destroy();
        stolen.fetch_add(1, std::memory_order_relaxed);
      }
    }
  };
  std::thread t1(thief);
  std::thread t2(thief);
  std::size_t next = 0;
  Cell c;
  std::uint32_t rng = 12345;
  auto thieves_had_their_part = [&] {
    return stolen.load(std::memory_order_relaxed) > 0 &&
           (!switch_to_fences || q.fenced() || !crew::detail::g_light_fences.load());
  };
  while (next < n ||
         (next < most && !thieves_had_their_part() && std::chrono::steady_clock::now() < give_up)) {
    rng = rng * 1664525u + 1013904223u;
    // Short bursts, then pops until empty: the owner and the thieves
    // meet on the last cells, where a missing fence lets both take one.
    const std::size_t burst = 1 + (rng >> 24) % 4;
    for (std::size_t k = 0; k < burst && next < most; ++k) {
      std::atomic<std::uint8_t>* slot = &taken[next];
      auto fill = [slot](Cell& cell) noexcept { cell.emplace([slot] { slot->fetch_add(1); }); };
      if (!q.try_push(fill)) break;
      ++next;
    }
    // A random pause first, so that thieves (whose heavy fence takes
    // microseconds) get to the cells too.
    for (std::uint32_t k = (rng >> 8) % 4096; k > 0; --k)
      std::atomic_signal_fence(std::memory_order_seq_cst);
    while (q.try_pop(c)) (void)c.invoke_and_destroy();
  }
  while (q.try_pop(c)) (void)c.invoke_and_destroy();
  done.store(true, std::memory_order_release);
  t1.join();
  t2.join();
  while (q.try_steal(c)) (void)c.invoke_and_destroy();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < next; ++i) wrong += taken[i].load() != 1 ? 1U : 0U;
  for (std::size_t i = next; i < most; ++i) wrong += taken[i].load() != 0 ? 1U : 0U;
  EXPECT_EQ(wrong, 0u);
  EXPECT_GT(stolen.load(), 0u);
  // Heavy steals are counted only where membarrier is there to make them.
  EXPECT_EQ(q.fenced(),
            switch_to_fences && crew::detail::g_light_fences.load(std::memory_order_relaxed));
}

INSTANTIATE_TEST_SUITE_P(Fences, LocalQueueRace, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "Switched" : "Light"; });

}  // namespace
}  // namespace crew

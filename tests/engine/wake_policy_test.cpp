// Tests of the engine's wake-up policy, through the public API: help for a
// task that waits for one queued beside it (at once, or deferred to a
// watching sleeper), sleepers that stop watching empty queues, workers woken
// onto their waker's CPU, a spinner that lost its CPU, and the batches a
// worker takes from the shared queue (order, counting, exact capacity).
#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crew/pool.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::Watchdog;

// A worker whose local queue is empty takes up to 8 cells in a row from a
// shared ring of 256 slots or more: the first to run, the rest into its
// local queue (queues.hpp, Queues::pop_batch). One worker must still
// run one submitter's tasks in submission order, and each task must count
// as submitted once, though its cell moved from one queue to another.
TEST(SharedBatches, OneWorkerRunsOneSubmittersTasksInOrderCountingEachOnce) {
  Watchdog dog;
  constexpr int kTasks = 1000;
  // No worker until resume(): one started at construction may still be
  // spinning when pause() returns and take the first task, which would
  // leave the batch test to the tasks behind it.
  Pool pool({.min_workers = 0, .max_workers = 1, .queue_capacity = 4096, .queue_shards = 1});
  std::vector<int> order;
  order.reserve(kTasks);
  pool.pause();  // every cell is published before the worker looks
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_EQ(pool.post([&order, i] { order.push_back(i); }), Admission::accepted);
  }
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(20s * test::kSlowdown));
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i) << "at " << i;
  const PoolStats st = pool.stats();
  EXPECT_EQ(st.submitted, static_cast<std::uint64_t>(kTasks));
  EXPECT_EQ(st.outcomes.succeeded, static_cast<std::uint64_t>(kTasks));
  EXPECT_EQ(st.queued, 0u);
}

// The cells a batch moved behind a running task are not held by it: a task
// that waits for the tasks queued right behind it (which its own worker may
// have taken in the same batch) sees them run on the other worker.
TEST(SharedBatches, ATaskWaitingForTheTasksBehindItSeesThemRunElsewhere) {
  Watchdog dog;
  constexpr int kBehind = 7;
  for (int round = 0; round < 20; ++round) {
    Pool pool({.min_workers = 2, .max_workers = 2, .queue_capacity = 4096, .queue_shards = 1});
    std::atomic<int> ran{0};
    std::atomic<bool> saw_all{false};
    pool.pause();
    ASSERT_EQ(pool.post([&] { saw_all = eventually([&] { return ran.load() == kBehind; }, 20s); }),
              Admission::accepted);
    for (int i = 0; i < kBehind; ++i) {
      ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
    }
    pool.resume();
    ASSERT_TRUE(pool.wait_idle(30s * test::kSlowdown));
    ASSERT_TRUE(saw_all.load()) << "round " << round << ": " << ran.load() << " of " << kBehind;
  }
}

// Small rings give one cell at a time, so the capacity stays exact: with
// the queue full and the one worker in the first task, exactly one more
// task fits (a batch would have freed up to 8 slots).
TEST(SharedBatches, ASmallQueueKeepsItsExactCapacity) {
  Watchdog dog;
  constexpr std::size_t kCapacity = 64;
  // No worker until resume(): one started at construction may still be
  // spinning when pause() returns, take the first task and free its slot.
  Pool pool({.min_workers = 0,
             .max_workers = 1,
             .queue_capacity = kCapacity,
             .queue_shards = 1,
             .overflow = Overflow::reject});
  Gate gate;
  pool.pause();
  ASSERT_EQ(pool.post([&] { (void)gate.wait(); }), Admission::accepted);
  for (std::size_t i = 1; i < kCapacity; ++i) ASSERT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_EQ(pool.post([] {}), Admission::full);
  pool.resume();
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  EXPECT_EQ(pool.post([] {}), Admission::accepted);
  EXPECT_EQ(pool.post([] {}), Admission::full);
  EXPECT_EQ(pool.stats().queued, kCapacity);
  gate.open();
  ASSERT_TRUE(pool.wait_idle(20s));
  EXPECT_EQ(pool.stats().outcomes.succeeded, kCapacity + 1);
}

// A pair of tasks queued together where the first waits for the second:
// the worker that takes the first must not be left as the only one awake.
// Returns false if the second did not start within `limit`.
bool run_waiting_pair(Pool& pool, std::chrono::milliseconds limit) {
  auto b_ran = std::make_shared<std::atomic<bool>>(false);
  auto a_done = std::make_shared<std::atomic<bool>>(false);
  EXPECT_EQ(pool.post([b_ran, a_done, limit] {
    const auto give_up = std::chrono::steady_clock::now() + limit * test::kSlowdown;
    while (!b_ran->load() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(20us);
    }
    a_done->store(true);
  }),
            Admission::accepted);
  EXPECT_EQ(pool.post([b_ran] { b_ran->store(true); }), Admission::accepted);
  const bool ok = eventually([&] { return b_ran->load(); }, limit);
  EXPECT_TRUE(eventually([&] { return a_done->load(); }));
  return ok;
}

// Help for a short backlog is deferred (one worker clears it sooner than
// another wakes up) only while a sleeper watches the queue; with every
// other worker asleep without a deadline it comes at once.
TEST(PoolWake, ATaskWaitingForASiblingQueuedBesideItGetsASecondWorker) {
  Watchdog dog;
  Pool pool({.name = "pair", .min_workers = 2, .max_workers = 2});
  for (int round = 0; round < 100; ++round) {
    // Odd rounds: both workers asleep first; even rounds: still spinning.
    if (round % 2 == 1) std::this_thread::sleep_for(2ms);
    ASSERT_TRUE(run_waiting_pair(pool, 2000ms)) << "round " << round;
  }
  ASSERT_TRUE(pool.wait_idle(10s));
}

// The deferred case: one worker is busy in a long task, the two others fell
// asleep while it was (so they watch the queue). The worker woken for the
// pair defers help and takes the first task, which waits for the second:
// a watching sleeper must take the second.
TEST(PoolWake, DeferredHelpIsTakenByAWatchingSleeper) {
  Watchdog dog;
  Pool pool({.name = "watch", .min_workers = 3, .max_workers = 3});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 3; }));
  Gate release;
  ASSERT_EQ(pool.post([&] { release.wait(); }), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  for (int round = 0; round < 50; ++round) {
    std::this_thread::sleep_for(2ms);  // the two others asleep, watching
    ASSERT_TRUE(run_waiting_pair(pool, 2000ms)) << "round " << round;
  }
  release.open();
  ASSERT_TRUE(pool.wait_idle(10s));
}

// The watcher that takes deferred work may block in it too, and so must
// bring in help for what it leaves queued. One worker is held; the two
// others sleep watching. Tasks a and b each wait for c, posted in the order
// a, c, b: the worker woken for them defers help (fewer than kBurst
// queued beside the one it takes) and takes a, with c and b in its local
// queue; a watcher, on its look, steals the newest, b; c then needs a
// fourth worker, which only that watcher can ask for (nobody else is awake
// and free). Without it c stayed queued in the first round. A fresh pool
// per round, so that the fourth worker is new each time.
TEST(PoolWake, AWatcherThatTakesDeferredWorkBringsInHelpForTheRest) {
  Watchdog dog;
  for (int round = 0; round < 20; ++round) {
    Pool pool({.name = "rest", .min_workers = 3, .max_workers = 4});
    ASSERT_TRUE(eventually([&] { return pool.stats().idle == 3; }));
    Gate release;
    ASSERT_EQ(pool.post([&] { release.wait(); }), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
    // Wake the two others, so that they fall asleep while the held worker
    // is awake, and watch.
    ASSERT_TRUE(run_waiting_pair(pool, 2000ms));
    std::this_thread::sleep_for(2ms);
    auto c_ran = std::make_shared<std::atomic<bool>>(false);
    auto wait_for_c = [c_ran] {
      const auto give_up = std::chrono::steady_clock::now() + 3s * test::kSlowdown;
      while (!c_ran->load() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(20us);
      }
    };
    ASSERT_EQ(pool.post(wait_for_c), Admission::accepted);
    ASSERT_EQ(pool.post([c_ran] { c_ran->store(true); }), Admission::accepted);
    ASSERT_EQ(pool.post(wait_for_c), Admission::accepted);
    ASSERT_TRUE(eventually([&] { return c_ran->load(); }, 2000ms)) << "round " << round;
    release.open();
    ASSERT_TRUE(pool.wait_idle(10s));
  }
}

// Voluntary context switches of this process's threads whose name starts
// with `prefix` (Linux: /proc/self/task/*/status).
std::uint64_t voluntary_switches(const std::string& prefix) {
  std::uint64_t sum = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      const std::string task = std::string("/proc/self/task/") + e->d_name;
      std::ifstream comm(task + "/comm");
      std::string name;
      if (!std::getline(comm, name) || name.rfind(prefix, 0) != 0) continue;
      std::ifstream status(task + "/status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
          sum += std::stoull(line.substr(line.find(':') + 1));
        }
      }
    }
    closedir(dir);
  }
  return sum;
}

// A sleeper watches the queues (a look every 4 ms) while another worker is
// awake, but only for a few looks once they stay empty: a pool with one
// long task and nothing queued does not wake its idle worker 250 times a
// second. (Counted as the idle worker's voluntary switches: each look is
// one.)
TEST(PoolWake, ASleeperStopsWatchingQueuesThatStayEmpty) {
  Watchdog dog;
  Pool pool({.name = "quiet", .min_workers = 2, .max_workers = 2});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == 2; }));
  Gate release;
  ASSERT_EQ(pool.post([&] { release.wait(); }), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  std::this_thread::sleep_for(100ms);  // the idle worker's looks are over
  const std::uint64_t before = voluntary_switches("quiet-");
  std::this_thread::sleep_for(400ms);  // 100 looks at the watch period
  const std::uint64_t looks = voluntary_switches("quiet-") - before;
  release.open();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_LE(looks, 5u);
}

// One watcher is enough: workers that go to sleep together while another
// is busy do not all look at the queues every 4 ms. Eight tasks that meet
// at a latch wake eight sleepers at once beside a long task; when they
// end, all eight fall asleep while the long task runs. With each of them
// watching, their looks came to 8 x 4 in the next 16 ms (crewd's 64 jobs
// workers on one CPU: 2,700 wake-ups in 3 s, docs/bench/overload.md).
TEST(PoolWake, SleepersThatFallAsleepTogetherLeaveTheWatchToOne) {
  Watchdog dog;
  constexpr int kMeet = 8;
  Pool pool({.name = "crowd", .min_workers = kMeet + 1, .max_workers = kMeet + 1});
  ASSERT_TRUE(eventually([&] { return pool.stats().idle == kMeet + 1; }));
  Gate release;
  ASSERT_EQ(pool.post([&] { release.wait(); }), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return pool.stats().busy == 1; }));
  std::atomic<int> arrived{0};
  for (int i = 0; i < kMeet; ++i) {
    ASSERT_EQ(pool.post([&] {
      arrived.fetch_add(1);
      const auto give_up = std::chrono::steady_clock::now() + 5s * test::kSlowdown;
      while (arrived.load() < kMeet && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(100us);
      }
    }),
              Admission::accepted);
  }
  ASSERT_TRUE(eventually([&] { return arrived.load() == kMeet && pool.stats().busy == 1; }));
  const std::uint64_t before = voluntary_switches("crowd-");
  std::this_thread::sleep_for(100ms);  // every sleeper's 4 looks, had each watched
  const std::uint64_t looks = voluntary_switches("crowd-") - before;
  release.open();
  ASSERT_TRUE(pool.wait_idle(10s));
  // One watcher's 4 looks, and the eight workers' own falls asleep if they
  // came after `before`: at most 12. Each watching, 32 looks and more.
  EXPECT_LE(looks, 16u);
}

// With the whole process on one CPU every woken worker lands on its waker's
// CPU: it runs what is queued without spinning and sleeps at the bottom of
// the idle stack. Every task still runs, and waiting pairs still complete.
TEST(PoolWake, WorkersWokenOntoTheirWakersCpuStillRunEverything) {
  Watchdog dog;
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  std::size_t first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  {
    Pool pool({.name = "one-cpu", .min_workers = 2, .max_workers = 3});  // threads inherit it
    std::atomic<int> ran{0};
    constexpr int kTasks = 3000;
    for (int i = 0; i < kTasks; ++i) {
      ASSERT_EQ(pool.post([&] { ran.fetch_add(1); }), Admission::accepted);
      if (i % 100 == 99) std::this_thread::sleep_for(200us);
    }
    EXPECT_TRUE(eventually([&] { return ran.load() == kTasks; }));
    for (int round = 0; round < 20; ++round) {
      EXPECT_TRUE(run_waiting_pair(pool, 2000ms)) << "round " << round;
    }
    EXPECT_TRUE(pool.wait_idle(10s));
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}

// ---- a spinner that lost its CPU ----

// Worker threads stopped in a signal handler stand in for spinners that
// lost their CPU (preempted by the thread that submits, or a virtual CPU
// the hypervisor took away): they hold their spinning tokens and do not
// poll.
std::atomic<bool> g_stall_release{false};
std::atomic<int> g_stalled{0};

extern "C" void stall_in_handler(int) {
  g_stalled.fetch_add(1);
  const timespec nap{0, 100'000};
  // Bounded, so that a test that fails still ends: 20 s.
  for (int i = 0; i < 200'000 && !g_stall_release.load(); ++i) nanosleep(&nap, nullptr);
}

// A submitter used to rely on any worker holding a spinning token, so a
// task posted while the only spinner was off its CPU waited until the
// spinner came back (a whole time slice, milliseconds, when it shared its
// CPU with the submitter) although another worker slept. A token whose
// holder has not polled for a few microseconds no longer counts: the
// sleeper is woken and runs the task.
TEST(PoolWake, ATaskIsNotLeftToASpinnerThatLostItsCpu) {
  Watchdog dog;
  struct sigaction action {};
  action.sa_handler = stall_in_handler;
  sigemptyset(&action.sa_mask);
  struct sigaction saved {};
  ASSERT_EQ(sigaction(SIGUSR2, &action, &saved), 0);
  g_stall_release = false;
  g_stalled = 0;

  // One worker more than may spin at once in the process, so at least one
  // sleeps; the others spin for as long as the test lasts.
  const std::size_t spinners = std::max<std::size_t>(1, usable_cpus() / 2);
  std::mutex mu;
  std::vector<pthread_t> threads;
  PoolOptions o;
  o.name = "stalled";
  o.min_workers = spinners + 1;
  o.max_workers = spinners + 1;
  o.spin = 30s;
  o.spin_when_contended = true;  // a busy machine must not stop the spinners
  o.on_worker_start = [&](std::uint64_t) {
    const std::lock_guard lock(mu);
    threads.push_back(pthread_self());
  };
  {
    Pool pool(std::move(o));
    ASSERT_TRUE(eventually([&] {
      const std::lock_guard lock(mu);
      return threads.size() == spinners + 1;
    }));
    // The spinners are the threads that burn CPU while the pool is idle.
    std::vector<pthread_t> spinning;
    ASSERT_TRUE(eventually(
        [&] {
          std::vector<double> before;
          for (const pthread_t t : threads) before.push_back(test::thread_cpu_ms(t));
          std::this_thread::sleep_for(100ms);
          spinning.clear();
          for (std::size_t i = 0; i < threads.size(); ++i) {
            if (test::thread_cpu_ms(threads[i]) - before[i] > 20.0) spinning.push_back(threads[i]);
          }
          return !spinning.empty() && spinning.size() < threads.size();
        },
        10'000ms))
        << "expected some workers spinning and one asleep";
    for (const pthread_t t : spinning) ASSERT_EQ(pthread_kill(t, SIGUSR2), 0);
    ASSERT_TRUE(eventually([&] { return g_stalled.load() == static_cast<int>(spinning.size()); }));

    const auto posted = std::chrono::steady_clock::now();
    std::atomic<bool> ran{false};
    ASSERT_EQ(pool.post([&] { ran = true; }), Admission::accepted);
    const bool in_time = eventually([&] { return ran.load(); }, 1000ms);
    const auto waited = std::chrono::steady_clock::now() - posted;
    g_stall_release = true;
    EXPECT_TRUE(in_time) << "the task waited for the stalled spinner ("
                         << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                         << " ms)";
    ASSERT_TRUE(pool.wait_idle(10s));
  }
  ASSERT_EQ(sigaction(SIGUSR2, &saved, nullptr), 0);
}

}  // namespace
}  // namespace crew

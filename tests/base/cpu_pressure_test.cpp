// Whether the machine's CPUs count as contended (src/base/cpu_pressure.hpp): the
// parser of the pressure file, the filter's thresholds, and a pool's idle
// workers that spin only briefly while the CPUs are contended (fed a
// made-up stall total) and for their whole window again once they are not.
#include "cpu_pressure.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "crew/pool.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"

namespace crew::detail {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Watchdog;

constexpr std::int64_t kMs = 1'000'000;  // in ns

TEST(PressureFile, TheTotalOfTheSomeLineIsRead) {
  EXPECT_EQ(parse_pressure_total("some avg10=1.50 avg60=0.20 avg300=0.05 total=123456\n"
                                 "full avg10=0.00 avg60=0.00 avg300=0.00 total=99\n"),
            123456);
  // The line order does not matter, nor a missing newline at the end.
  EXPECT_EQ(parse_pressure_total("full avg10=0.00 avg60=0.00 avg300=0.00 total=99\n"
                                 "some avg10=0.00 avg60=0.00 avg300=0.00 total=7"),
            7);
  EXPECT_EQ(parse_pressure_total("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"), 0);
}

TEST(PressureFile, AnythingElseIsUnavailable) {
  EXPECT_EQ(parse_pressure_total(""), -1);
  EXPECT_EQ(parse_pressure_total("full avg10=0.00 avg60=0.00 avg300=0.00 total=99\n"), -1);
  EXPECT_EQ(parse_pressure_total("some avg10=0.00 avg60=0.00 avg300=0.00\n"), -1);
  EXPECT_EQ(parse_pressure_total("some avg10=0.00 total=\n"), -1);
  EXPECT_EQ(parse_pressure_total("some avg10=0.00 total=-5\n"), -1);
  EXPECT_EQ(parse_pressure_total("some avg10=0.00 total=12x\n"), -1);
  EXPECT_EQ(parse_pressure_total("something total=12\n"), -1);
  // Cut off after the first digits (a short read): a number, but not this
  // one; the file is read whole, 256 bytes hold both lines.
  EXPECT_EQ(parse_pressure_total("some avg10=0.00 total=99999999999999999999999\n"), -1);
}

TEST(PressureFile, TheMachinesOwnFileGrows) {
  std::ifstream file("/proc/pressure/cpu");
  std::stringstream first;
  first << file.rdbuf();
  if (!file || first.str().empty()) {
    GTEST_SKIP() << "/proc/pressure/cpu cannot be read on this machine (not Linux, or a kernel "
                    "without pressure stall information): the CPUs then never count as "
                    "contended, which the pool tests below cover with a made-up source";
  }
  const std::int64_t before = parse_pressure_total(first.str());
  ASSERT_GE(before, 0) << first.str();
  std::this_thread::sleep_for(10ms);
  std::ifstream again("/proc/pressure/cpu");
  std::stringstream second;
  second << again.rdbuf();
  EXPECT_GE(parse_pressure_total(second.str()), before) << second.str();
}

// Feeds the filter readings kPeriodNs apart in which threads waited
// `share` of the time; returns its answers.
std::vector<bool> feed(CpuContention& filter, std::int64_t& now, std::int64_t& total, double share,
                       int readings) {
  std::vector<bool> answers;
  for (int i = 0; i < readings; ++i) {
    now += CpuContention::kPeriodNs;
    total += static_cast<std::int64_t>(share * CpuContention::kPeriodNs / 1000);
    answers.push_back(filter.update(now, total));
  }
  return answers;
}

TEST(CpuContention, ContendedFromTheUpperShareUntilUnderTheLowerOne) {
  CpuContention filter;
  std::int64_t now = 1000 * kMs;
  std::int64_t total = 5'000'000;
  EXPECT_FALSE(filter.update(now, total)) << "one reading is no share yet";
  // A machine whose threads wait 90 % of the time: contended at once.
  EXPECT_EQ(feed(filter, now, total, 0.9, 1), std::vector<bool>{true});
  EXPECT_NEAR(filter.share(), 0.9, 1e-9);
  // Between the two thresholds (the spin's own CPU gone from the share):
  // it stays contended.
  EXPECT_EQ(feed(filter, now, total, 0.45, 20), std::vector<bool>(20, true));
  // Well under the lower one: free again after a stretch of quiet readings,
  // and stays so.
  const std::vector<bool> falling = feed(filter, now, total, 0.05, 30);
  EXPECT_FALSE(falling.back());
  int free_after = 0;
  while (falling[static_cast<std::size_t>(free_after)]) ++free_after;
  EXPECT_GE(free_after, 4) << "a few quiet readings are not enough";
  EXPECT_LE(free_after, 16);
  for (std::size_t i = static_cast<std::size_t>(free_after); i < falling.size(); ++i) {
    EXPECT_FALSE(falling[i]) << i;
  }
  // Between the thresholds from below: it stays free.
  EXPECT_EQ(feed(filter, now, total, 0.45, 20), std::vector<bool>(20, false));
}

TEST(CpuContention, AReadingAfterALongGapStartsAfresh) {
  CpuContention filter;
  std::int64_t now = 1000 * kMs;
  std::int64_t total = 0;
  (void)filter.update(now, total);
  EXPECT_TRUE(feed(filter, now, total, 0.95, 3).back());
  // Nobody read for a second (the pool idle); the machine was quiet.
  now += 1000 * kMs;
  total += 1000;  // 1 ms of stalls in that second
  EXPECT_FALSE(filter.update(now, total));
  EXPECT_LT(filter.share(), 0.01);
}

TEST(CpuContention, ATotalThatGoesBackwardsOnlyRestartsTheCount) {
  CpuContention filter;
  std::int64_t now = 1000 * kMs;
  std::int64_t total = 1'000'000;
  (void)filter.update(now, total);
  EXPECT_TRUE(feed(filter, now, total, 0.9, 2).back());
  now += CpuContention::kPeriodNs;
  EXPECT_TRUE(filter.update(now, 10)) << "the last answer stands";
  total = 10;
  EXPECT_TRUE(feed(filter, now, total, 0.9, 1).back());
  // A clock that did not move is no reading either.
  EXPECT_TRUE(filter.update(now, total + 1'000'000));
}

// ---- a pool's workers under a made-up stall total ----

// A stall total that grows at `share` of real time, advanced by a thread of
// its own every 200 us.
class FakePressure {
 public:
  explicit FakePressure(double share) : share_permille_(static_cast<int>(share * 1000)) {
    set_pressure_source_for_testing(&FakePressure::read);
    ticker_ = std::jthread([this](std::stop_token stop) {
      auto last = std::chrono::steady_clock::now();
      while (!stop.stop_requested()) {
        std::this_thread::sleep_for(200us);
        const auto now = std::chrono::steady_clock::now();
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now - last).count();
        g_total_us.fetch_add(us * share_permille_.load() / 1000);
        last = now;
      }
    });
  }
  ~FakePressure() {
    ticker_.request_stop();
    ticker_.join();
    set_pressure_source_for_testing(nullptr);
  }
  FakePressure(const FakePressure&) = delete;
  FakePressure& operator=(const FakePressure&) = delete;

  void set_share(double share) { share_permille_ = static_cast<int>(share * 1000); }

 private:
  static std::int64_t read() noexcept { return g_total_us.load(); }
  static inline std::atomic<std::int64_t> g_total_us{1'000'000};
  std::atomic<int> share_permille_;
  std::jthread ticker_;
};

// A one-worker pool whose idle worker would spin for 10 s after each task.
// The worker and the test's thread are pinned to two different CPUs: a
// worker woken onto its waker's CPU does not spin at all (Worker::crowded,
// docs/design/wake-ups.md, "Waking workers without losing a wake-up"), and with one
// worker and a waker that sleeps right after the post the kernel often
// puts it there, which would hide the spin these tests look for.
struct OneSpinner {
  explicit OneSpinner(bool spin_when_contended) {
    // Read (and cached) from this thread's affinity before it is pinned to
    // one CPU below: with one usable CPU no worker of the process spins.
    (void)usable_cpus();
    EXPECT_EQ(sched_getaffinity(0, sizeof(saved_), &saved_), 0);
    std::vector<std::size_t> cpus;
    for (std::size_t cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &saved_)) cpus.push_back(cpu);
    }
    two_cpus = cpus.size() >= 2;
    worker_cpu = cpus.empty() ? 0 : cpus[0];
    if (two_cpus) {
      cpu_set_t mine;
      CPU_ZERO(&mine);
      CPU_SET(cpus[1], &mine);
      EXPECT_EQ(sched_setaffinity(0, sizeof(mine), &mine), 0);
    }
    PoolOptions o;
    o.name = "pressure";
    o.min_workers = 1;
    o.max_workers = 1;
    o.spin = 10s;
    o.spin_when_contended = spin_when_contended;
    o.on_worker_start = [this](std::uint64_t) {
      if (two_cpus) {
        cpu_set_t its;
        CPU_ZERO(&its);
        CPU_SET(worker_cpu, &its);
        EXPECT_EQ(sched_setaffinity(0, sizeof(its), &its), 0);
      }
      const std::lock_guard lock(mu);
      thread = pthread_self();
      started = true;
    };
    pool.emplace(std::move(o));
    EXPECT_TRUE(eventually([this] {
      const std::lock_guard lock(mu);
      return started;
    }));
  }
  ~OneSpinner() {
    pool.reset();
    EXPECT_EQ(sched_setaffinity(0, sizeof(saved_), &saved_), 0);
  }
  OneSpinner(const OneSpinner&) = delete;
  OneSpinner& operator=(const OneSpinner&) = delete;
  // Runs a task, then the CPU time the idle worker used in the next 100 ms.
  double idle_cpu_ms_after_a_task() {
    std::atomic<bool> ran{false};
    EXPECT_EQ(pool->post([&] { ran = true; }), Admission::accepted);
    EXPECT_TRUE(eventually([&] { return ran.load(); }));
    std::this_thread::sleep_for(20ms);  // a reading or more after the task
    pthread_t t{};
    {
      const std::lock_guard lock(mu);
      t = thread;
    }
    const double before = test::thread_cpu_ms(t);
    std::this_thread::sleep_for(100ms);
    return test::thread_cpu_ms(t) - before;
  }

  cpu_set_t saved_{};
  bool two_cpus = false;
  std::size_t worker_cpu = 0;  // the worker's CPU (pinned if two_cpus)
  std::mutex mu;
  pthread_t thread{};
  bool started = false;
  std::optional<Pool> pool;
};

constexpr const char* kNeedsTwoCpus =
    "needs two CPUs to keep the worker off its waker's CPU, where it never spins";

TEST(PoolSpin, IdleWorkersSpinOnlyBrieflyWhileTheCpusAreContended) {
  Watchdog dog;
  FakePressure pressure(0.9);
  OneSpinner pool(/*spin_when_contended=*/false);
  // The first look primes the gauge; the worker then spins until the next
  // reading (4 ms) says the CPUs are contended, and from then on for at
  // most kContendedSpinNs (5 us) after each task, then sleeps.
  for (int round = 0; round < 3; ++round) {
    const double used = pool.idle_cpu_ms_after_a_task();
    EXPECT_LT(used, 15.0) << "round " << round << ": the idle worker spun for " << used
                          << " ms of 100 while threads waited for a CPU";
  }
}

TEST(PoolSpin, IdleWorkersSpinAgainOnceTheCpusAreFree) {
  Watchdog dog;
  FakePressure pressure(0.9);
  OneSpinner pool(/*spin_when_contended=*/false);
  if (!pool.two_cpus) GTEST_SKIP() << kNeedsTwoCpus;
  EXPECT_LT(pool.idle_cpu_ms_after_a_task(), 15.0);
  pressure.set_share(0.02);
  // Readings come only from workers about to spin: one per task below,
  // each more than CpuContention::kRestartNs after the last, so the quiet
  // share replaces the average (the slow fall within a steady stream of
  // readings is CpuContention's test above).
  const bool spins = eventually([&] { return pool.idle_cpu_ms_after_a_task() > 20.0; }, 10'000ms);
  EXPECT_TRUE(spins) << "the idle worker never spun again on a quiet machine";
}

TEST(PoolSpin, SpinWhenContendedKeepsTheSpin) {
  Watchdog dog;
  FakePressure pressure(0.9);
  OneSpinner pool(/*spin_when_contended=*/true);
  if (!pool.two_cpus) GTEST_SKIP() << kNeedsTwoCpus;
  // A spinner that shares a loaded machine may get little of a CPU in one
  // window: look at a few.
  const bool spins = eventually([&] { return pool.idle_cpu_ms_after_a_task() > 20.0; }, 10'000ms);
  EXPECT_TRUE(spins) << "spin_when_contended: the idle worker should spin";
}

// A spinner that has kept its CPU for kSpinYieldNs yields it when it
// sees nothing queued: a thread that shares its CPU gets nearly all of it,
// instead of half in turns of a time slice (crewd at wrk -c8: the I/O
// threads waited behind the compute workers' spins, and the p99 was ten
// times the inline handler's). A busy thread pinned to the spinner's CPU
// for 300 ms: the spinner, which would spin for 10 s, must use under a
// third of the CPU time the busy thread gets (about as much without the
// yield).
TEST(PoolSpin, ASpinnerYieldsItsCpuToAThreadWaitingForIt) {
  Watchdog dog;
  OneSpinner pool(/*spin_when_contended=*/true);
  if (!pool.two_cpus) GTEST_SKIP() << kNeedsTwoCpus;
  std::atomic<bool> ran{false};
  ASSERT_EQ(pool.pool->post([&] { ran = true; }), Admission::accepted);
  ASSERT_TRUE(eventually([&] { return ran.load(); }));
  pthread_t spinner{};
  {
    const std::lock_guard lock(pool.mu);
    spinner = pool.thread;
  }
  double busy_ms = 0;
  double spinner_ms = 0;
  std::thread busy([&] {
    cpu_set_t its;
    CPU_ZERO(&its);
    CPU_SET(pool.worker_cpu, &its);
    EXPECT_EQ(sched_setaffinity(0, sizeof(its), &its), 0);
    const double spinner_before = test::thread_cpu_ms(spinner);
    const double before = test::thread_cpu_ms(pthread_self());
    const auto until = std::chrono::steady_clock::now() + 300ms;
    while (std::chrono::steady_clock::now() < until) {
    }
    busy_ms = test::thread_cpu_ms(pthread_self()) - before;
    spinner_ms = test::thread_cpu_ms(spinner) - spinner_before;
  });
  busy.join();
  EXPECT_LT(spinner_ms, busy_ms / 3) << "the spinner used " << spinner_ms
                                     << " ms of CPU, the thread beside it " << busy_ms << " ms";
}

}  // namespace
}  // namespace crew::detail

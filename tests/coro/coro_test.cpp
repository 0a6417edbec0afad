// Coroutine tasks: spawn and the Task handle, what a coroutine awaits,
// stops and deadlines, outcomes (crew/coro.hpp). Counting, timing and
// observers: coro_accounting_test.cpp; callbacks: coro_callback_test.cpp.
// And the scheduling of the timer thread a worker starts.
#include "crew/coro.hpp"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coro_test_util.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::fixed_workers;
using test::Watchdog;

using test::FrameGuard;

Co<int> answer() { co_return 42; }

Co<int> add_children(int a) {
  const int x = co_await answer();
  co_return x + a;
}

Co<void> throws() {
  co_await yield();
  throw std::runtime_error("boom");
}

TEST(CoroTask, SpawnGivesATaskHandleWithTheValue) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  Task<int> t = spawn(pool, add_children(1), {.name = "adder"});
  EXPECT_EQ(t.get(), 43);
  EXPECT_EQ(t.status(), TaskStatus::succeeded);
  EXPECT_EQ(t.name(), "adder");
  EXPECT_NE(t.id(), 0u);
}

TEST(CoroTask, AnExceptionEndsTheTaskFailedAndGetRethrowsIt) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  Task<void> t = spawn(pool, throws());
  EXPECT_THROW(t.get(), std::runtime_error);
  EXPECT_EQ(t.status(), TaskStatus::failed);
}

TEST(CoroTask, ADetachedTasksExceptionGoesToTheHandler) {
  Watchdog dog;
  std::atomic<int> handled{0};
  PoolOptions o = fixed_workers("co", 2);
  o.on_exception = [&](const TaskRef&, std::exception_ptr) { handled.fetch_add(1); };
  Pool pool(o);
  ASSERT_EQ(spawn_detached(pool, throws()), Admission::accepted);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(handled.load(), 1);
}

TEST(CoroTask, SleepingTasksHoldNoWorker) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  std::atomic<int> done{0};
  std::vector<Task<void>> tasks;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) tasks.push_back(spawn(pool, test::counting_sleeper(100ms, &done)));
  for (auto& t : tasks) t.get();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(done.load(), 200);
  // One worker holding each sleep would take 20 s.
  EXPECT_LT(took, 2s * test::kSlowdown);
  EXPECT_GE(took, 100ms);
}

// More sleeps due at once than the timer thread takes in one round (it
// fires them in batches of its reserved capacity while every worker is
// busy): every one of them ends, none early.
TEST(CoroTask, MoreSleepsDueAtOnceThanOneTimerRoundTakesAllEnd) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  constexpr int kSleeps = 1000;
  std::atomic<int> done{0};
  const auto at = std::chrono::steady_clock::now() + 200ms * test::kSlowdown;
  auto sleep_to = [](std::chrono::steady_clock::time_point t, std::atomic<int>* n) -> Co<void> {
    co_await sleep_until(t);
    EXPECT_GE(std::chrono::steady_clock::now(), t);
    n->fetch_add(1);
  };
  std::vector<Task<void>> tasks;
  for (int i = 0; i < kSleeps; ++i) tasks.push_back(spawn(pool, sleep_to(at, &done)));
  ASSERT_TRUE(test::eventually(
      [&] { return coroutine_tasks(pool).suspended.size() == std::size_t{kSleeps}; }));
  test::WorkerHold hold(pool, 2);
  std::this_thread::sleep_until(at + 20ms);
  EXPECT_EQ(done.load(), 0);  // their resumptions wait for a worker
  hold.release();
  for (Task<void>& t : tasks) t.get();
  EXPECT_EQ(done.load(), kSleeps);
}

// Notes how late the sleep ended, in microseconds.
Co<void> late_sleeper(std::chrono::steady_clock::time_point at, std::atomic<std::int64_t>* late) {
  co_await sleep_until(at);
  late->store(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - at)
          .count());
}

// Idle workers fire the timers they sleep until; the timer thread fires
// those due while every worker is busy. No sleep ends early, none is lost.
TEST(CoroTask, SleepsEndOnTimeWhetherTheWorkersAreIdleOrBusy) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  using Clock = std::chrono::steady_clock;
  constexpr int kIdle = 100;
  std::vector<std::atomic<std::int64_t>> late(kIdle + 1);
  for (auto& l : late) l.store(-1);
  std::vector<Task<void>> tasks;
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < kIdle; ++i) {
    const auto at = t0 + std::chrono::microseconds(200 * (i % 50) + 37 * i);
    tasks.push_back(spawn(pool, late_sleeper(at, &late[static_cast<std::size_t>(i)])));
  }
  for (Task<void>& t : tasks) t.get();
  // Both workers busy past the next timer: the timer thread queues its
  // resumption, which runs once a worker is free. The sleep leaves room for
  // the suspension to be seen and both workers to be held before it ends
  // (with 50 ms a loaded machine missed that once).
  const Clock::time_point at = Clock::now() + 200ms * test::kSlowdown;
  Task<void> busy = spawn(pool, late_sleeper(at, &late[kIdle]));
  ASSERT_TRUE(test::eventually([&] { return coroutine_tasks(pool).suspended.size() == 1; }));
  test::WorkerHold hold(pool, 2);
  std::this_thread::sleep_until(at + 20ms);
  EXPECT_FALSE(busy.ready());  // its resumption waits for a worker
  hold.release();
  busy.get();
  for (std::size_t i = 0; i < late.size(); ++i) {
    EXPECT_GE(late[i].load(), 0) << "sleep " << i << " ended early or not at all";
    EXPECT_LT(late[i].load(), 2'000'000 * test::kSlowdown) << "sleep " << i;
  }
  EXPECT_GE(late[kIdle].load(), 20'000);  // it waited for the gate
}

Co<int> await_handle(Task<int> t) { co_return co_await t + 1; }

TEST(CoroTask, AwaitsAPlainTaskHandle) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  Task<int> plain = pool.submit([] {
    std::this_thread::sleep_for(20ms);
    return 6;
  });
  EXPECT_EQ(spawn(pool, await_handle(std::move(plain))).get(), 7);
}

Co<int> slow_value(int v) {
  co_await sleep_for(30ms);
  co_return v;
}

TEST(CoroTask, AwaitsAnotherCoroutineTasksHandle) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  Pool other(fixed_workers("other", 1));
  Task<int> child = spawn(other, slow_value(9));
  EXPECT_EQ(spawn(pool, await_handle(std::move(child))).get(), 10);
}

Co<int> await_failed(Task<void> t) {
  try {
    co_await t;
  } catch (const std::runtime_error&) {
    co_return 1;
  }
  co_return 0;
}

TEST(CoroTask, AnAwaitedTasksExceptionIsThrownAtTheCoAwait) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  EXPECT_EQ(spawn(pool, await_failed(spawn(pool, throws()))).get(), 1);
}

// Records what the co_await threw.
Co<void> long_sleep(std::atomic<int>* code, std::atomic<bool>* slept) {
  FrameGuard g;
  slept->store(true);
  try {
    co_await sleep_for(10s);
  } catch (const Error& e) {
    code->store(static_cast<int>(e.code()));
    throw;
  }
}

TEST(CoroTask, CancelEndsASleepAtOnceWithCancelled) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> code{-1};
  std::atomic<bool> slept{false};
  Task<void> t = spawn(pool, long_sleep(&code, &slept));
  ASSERT_TRUE(test::eventually([&] { return slept.load(); }));
  std::this_thread::sleep_for(5ms);  // suspended by now, most likely
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(t.cancel(), CancelResult::stop_requested);
  EXPECT_TRUE(t.wait_for(1s * test::kSlowdown));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms * test::kSlowdown);
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(t.reason(), Errc::cancelled);
  EXPECT_EQ(code.load(), static_cast<int>(Errc::cancelled));
  EXPECT_EQ(FrameGuard::alive(), 0);
}

TEST(CoroTask, ATimeoutEndsASleepTimedOut) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> code{-1};
  std::atomic<bool> slept{false};
  const auto t0 = std::chrono::steady_clock::now();
  Task<void> t = spawn(pool, long_sleep(&code, &slept), {.timeout = 50ms});
  EXPECT_THROW(t.get(), Error);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 50ms);
  EXPECT_LT(took, 1s * test::kSlowdown);
  EXPECT_EQ(t.status(), TaskStatus::timed_out);
  EXPECT_EQ(code.load(), static_cast<int>(Errc::timed_out));
}

TEST(CoroTask, CancelBeforeTheStartEndsTheTaskWithoutRunningIt) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  test::Gate gate;
  ASSERT_EQ(pool.post([&] { gate.wait(); }), Admission::accepted);
  std::atomic<int> code{-1};
  std::atomic<bool> slept{false};
  Task<void> t = spawn(pool, long_sleep(&code, &slept));
  // Its start is queued behind the gate: the cancel stops it, and the
  // start, when it comes up, destroys the frame unrun.
  EXPECT_EQ(t.cancel(), CancelResult::stop_requested);
  gate.open();
  ASSERT_TRUE(t.wait_for(10s));
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(t.reason(), Errc::cancelled);
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_FALSE(slept.load());
  EXPECT_EQ(FrameGuard::alive(), 0);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
  EXPECT_EQ(s.outcomes.cancelled, 1u);
}

Co<void> parent_of(Pool* pool, std::atomic<int>* code, std::atomic<bool>* slept,
                   Task<void>* child) {
  *child = spawn(*pool, long_sleep(code, slept));
  co_await *child;
}

TEST(CoroTask, AChildSpawnedFromACoroutineIsStoppedWithIt) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> code{-1};
  std::atomic<bool> slept{false};
  Task<void> child;
  Task<void> parent = spawn(pool, parent_of(&pool, &code, &slept, &child));
  ASSERT_TRUE(test::eventually([&] { return slept.load(); }));
  (void)parent.cancel();
  EXPECT_TRUE(parent.wait_for(2s * test::kSlowdown));
  EXPECT_EQ(parent.status(), TaskStatus::cancelled);
  ASSERT_TRUE(child.wait_for(2s * test::kSlowdown));
  EXPECT_EQ(child.status(), TaskStatus::cancelled);
  EXPECT_EQ(code.load(), static_cast<int>(Errc::cancelled));
}

Co<bool> token_follows_the_task() {
  const bool before = current_stop_token().stop_requested();
  co_await yield();
  co_return before || current_stop_token().stop_possible();
}

TEST(CoroTask, EachTaskHasAStopToken) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  EXPECT_TRUE(spawn(pool, token_follows_the_task()).get());
  EXPECT_FALSE(current_stop_token().stop_possible());  // outside a coroutine task
}

// A pool of one worker held by a gate, its queue of one slot full: the
// next submission meets the overflow policy. Opens the gate when it goes.
struct FullPool {
  explicit FullPool(Overflow overflow) : pool(options(overflow)) {
    EXPECT_EQ(pool.post([this] { gate.wait(); }), Admission::accepted);
    EXPECT_TRUE(test::eventually([this] { return pool.stats().busy == 1; }));
    EXPECT_EQ(pool.post([] {}), Admission::accepted);  // fills the queue
  }
  ~FullPool() { gate.open(); }
  FullPool(const FullPool&) = delete;
  FullPool& operator=(const FullPool&) = delete;
  static PoolOptions options(Overflow overflow) {
    PoolOptions o = fixed_workers("co", 1);
    o.queue_capacity = 1;
    o.overflow = overflow;
    return o;
  }
  test::Gate gate;
  Pool pool;
};

TEST(CoroTask, TrySpawnOnAFullQueueGivesARejectedHandle) {
  Watchdog dog;
  FullPool full(Overflow::reject);
  Pool& pool = full.pool;
  std::atomic<int> done{0};
  Task<void> t = try_spawn(pool, test::counting_sleeper(1ms, &done));
  EXPECT_EQ(t.status(), TaskStatus::rejected);
  try {
    t.get();
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::rejected);
    EXPECT_EQ(e.admission(), Admission::full);
  }
  full.gate.open();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(done.load(), 0);
}

TEST(CoroTask, AnExpiredQueueDeadlineEndsTheTaskUnrun) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  test::Gate gate;
  ASSERT_EQ(pool.post([&] { gate.wait(); }), Admission::accepted);
  std::atomic<int> done{0};
  Task<void> t = spawn(pool, test::counting_sleeper(1ms, &done), {.queue_timeout = 1ms});
  std::this_thread::sleep_for(10ms);
  gate.open();
  t.wait();
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_EQ(t.reason(), Errc::expired);
  EXPECT_EQ(done.load(), 0);
  ASSERT_TRUE(pool.wait_idle(10s));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.total(), s.submitted);
}

Co<int> yields(int n);

// A plain task waiting for a coroutine task on the only worker: the wait
// runs the pool's queued tasks, the coroutine's steps among them.
TEST(CoroTask, AWaitOnAWorkerForACoroutineTaskRunsItsSteps) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  Task<int> outer = pool.submit([&pool] { return spawn(pool, add_children(2)).get(); });
  EXPECT_EQ(outer.get(), 44);
  Task<int> yielding = pool.submit([&pool] { return spawn(pool, yields(50)).get(); });
  EXPECT_EQ(yielding.get(), 50);
}

Co<int> yields(int n) {
  int sum = 0;
  for (int i = 0; i < n; ++i) {
    co_await yield();
    ++sum;
  }
  co_return sum;
}

TEST(CoroTask, ManyTasksYieldingOnTwoWorkersAllFinish) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::vector<Task<int>> tasks;
  for (int i = 0; i < 1000; ++i) tasks.push_back(spawn(pool, yields(20)));
  for (auto& t : tasks) EXPECT_EQ(t.get(), 20);
}

Co<int> sum_all(std::vector<Task<int>>* tasks) {
  int sum = 0;
  for (const int v : co_await when_all(*tasks)) sum += v;
  co_return sum;
}

TEST(CoroTask, WhenAllReturnsEveryValueInOrder) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::vector<Task<int>> tasks;
  for (int i = 1; i <= 10; ++i) tasks.push_back(spawn(pool, slow_value(i)));
  tasks.push_back(pool.submit([] { return 100; }));
  EXPECT_EQ(spawn(pool, sum_all(&tasks)).get(), 155);
}

Co<void> fails_soon() {
  co_await sleep_for(5ms);
  throw std::runtime_error("first");
}

Co<void> await_all(std::vector<Task<void>>* tasks) { co_await when_all(*tasks); }

TEST(CoroTask, WhenAllCancelsTheRestOnTheFirstExceptionAndRethrowsIt) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<int> code{-1};
  std::atomic<bool> slept{false};
  std::vector<Task<void>> tasks;
  tasks.push_back(spawn(pool, fails_soon()));
  tasks.push_back(spawn(pool, long_sleep(&code, &slept)));
  Task<void> all = spawn(pool, await_all(&tasks));
  EXPECT_THROW(all.get(), std::runtime_error);
  EXPECT_EQ(tasks[1].status(), TaskStatus::cancelled);
  EXPECT_EQ(FrameGuard::alive(), 0);
}

TEST(CoroTask, TheSnapshotListsSuspendedTasksWithWhatTheyWaitFor) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  EXPECT_EQ(coroutine_tasks(pool).live, 0u);
  std::atomic<int> code{-1};
  std::atomic<bool> slept{false};
  Task<void> sleeping = spawn(pool, long_sleep(&code, &slept), {.name = "sleeping"});
  ASSERT_TRUE(test::eventually([&] { return slept.load(); }));
  ASSERT_TRUE(test::eventually([&] { return coroutine_tasks(pool).suspended.size() == 1; }));
  std::this_thread::sleep_for(20ms);
  const CoroutineTasks snap = coroutine_tasks(pool);
  EXPECT_EQ(snap.live, 1u);
  ASSERT_EQ(snap.suspended.size(), 1u);
  EXPECT_EQ(snap.suspended[0].task.name, "sleeping");
  EXPECT_EQ(snap.suspended[0].waits_on, "sleep");
  EXPECT_GE(snap.suspended[0].suspended_for, 20ms);
  (void)sleeping.cancel();
  sleeping.wait();
  EXPECT_TRUE(test::eventually([&] { return coroutine_tasks(pool).live == 0; }));
}

// Three generations, each awaiting the next: the leaf sleeps.
Co<void> nested_sleep(Pool* pool, int depth, std::atomic<bool>* slept) {
  if (depth == 0) {
    slept->store(true);
    co_await sleep_for(60s);
    co_return;
  }
  Task<void> child =
      spawn(*pool, nested_sleep(pool, depth - 1, slept), {.name = "g" + std::to_string(depth - 1)});
  co_await child;
}

TEST(CoroTask, TheSnapshotListsTheChildrenOfRunningTasks) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::atomic<bool> slept{false};
  Task<void> root = spawn(pool, nested_sleep(&pool, 2, &slept), {.name = "g2"});
  ASSERT_TRUE(test::eventually([&] { return slept.load(); }));
  ASSERT_TRUE(test::eventually([&] { return coroutine_tasks(pool).suspended.size() == 3; }));
  const CoroutineTasks snap = coroutine_tasks(pool);
  EXPECT_EQ(snap.live, 3u);
  std::vector<std::string> seen;
  for (const SuspendedCoroutine& c : snap.suspended) {
    seen.push_back(c.task.name + ":" + std::string(c.waits_on));
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"g0:sleep", "g1:task", "g2:task"}));
  (void)root.cancel();  // reaches the grandchild through the child
  root.wait();
  EXPECT_EQ(root.status(), TaskStatus::cancelled);
  EXPECT_TRUE(test::eventually([&] { return coroutine_tasks(pool).live == 0; }));
}

Co<std::size_t> first_of(std::vector<Task<int>>* tasks) { co_return co_await when_any(*tasks); }

TEST(CoroTask, WhenAnyReturnsTheIndexOfATaskThatEnded) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  std::vector<Task<int>> tasks;
  tasks.push_back(pool.submit([] {
    std::this_thread::sleep_for(2s);
    return 1;
  }));
  tasks.push_back(spawn(pool, slow_value(2)));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(spawn(pool, first_of(&tasks)).get(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s * test::kSlowdown);
  EXPECT_EQ(tasks[1].get(), 2);
  EXPECT_EQ(tasks[0].get(), 1);  // not cancelled: it ran to its end
}

// The thread of each step, read through a call the compiler cannot fold
// (see coro_traps_test.cpp).
[[gnu::noinline]] std::thread::id step_thread() {
  asm volatile("" ::: "memory");
  return std::this_thread::get_id();
}

// The sleep is long enough that it is still ahead when the step arms it:
// one that came due before its suspension settled would not suspend, and
// the caller would go on with the frame (one sleep of 1 ms did, under TSan
// with both CPUs busy).
Co<void> record_threads(std::thread::id* start, std::thread::id* after) {
  *start = step_thread();
  co_await sleep_for(100ms);
  *after = step_thread();
}

TEST(CoroTask, UnderCallerRunsTheStartRunsOnTheCallerAndTheRestOnThePool) {
  Watchdog dog;
  FullPool full(Overflow::caller_runs);
  Pool& pool = full.pool;
  std::thread::id start;
  std::thread::id after;
  Task<void> t = spawn(pool, record_threads(&start, &after));
  EXPECT_EQ(start, std::this_thread::get_id());
  full.gate.open();
  t.get();
  EXPECT_NE(after, std::this_thread::get_id());
  EXPECT_NE(after, std::thread::id{});
}

Co<int> fill_group(Pool* pool, bool fail) {
  std::atomic<int> ran{0};
  Group group(*pool);
  for (int i = 0; i < 20; ++i) {
    (void)group.submit([&ran] {
      std::this_thread::sleep_for(1ms);
      ran.fetch_add(1);
    });
  }
  if (fail) (void)group.submit([] { throw std::runtime_error("in the group"); });
  co_await wait_all(group);
  co_return ran.load();
}

TEST(CoroTask, WaitAllAwaitsEveryTaskOfAGroupAndRethrowsItsFailure) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 2));
  EXPECT_EQ(spawn(pool, fill_group(&pool, false)).get(), 20);
  EXPECT_THROW(spawn(pool, fill_group(&pool, true)).get(), std::runtime_error);
}

Co<int> schedule_on(const Pool* pool) {
  co_await schedule(*pool);
  co_return 1;
}

TEST(CoroTask, ScheduleYieldsOnTheOwnPoolAndRefusesAnother) {
  Watchdog dog;
  Pool pool(fixed_workers("co", 1));
  Pool other(fixed_workers("other", 1));
  EXPECT_EQ(spawn(pool, schedule_on(&pool)).get(), 1);
  Task<int> t = spawn(pool, schedule_on(&other));
  try {
    (void)t.get();
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_options);
  }
}

// A thread's policy and nice value from /proc (fields 41 and 19 of stat);
// {-1, 0} if no thread of this process has that name.
std::pair<int, int> policy_and_nice_of(const std::string& name) {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return {-1, 0};
  std::pair<int, int> found{-1, 0};
  while (dirent* e = readdir(dir)) {
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(task + "/comm");
    std::string comm_name;
    if (!std::getline(comm, comm_name) || comm_name != name) continue;
    std::ifstream stat(task + "/stat");
    std::string line;
    std::getline(stat, line);
    std::istringstream fields(line.substr(line.rfind(')') + 2));  // from field 3 on
    std::vector<std::string> f;
    for (std::string x; fields >> x;) f.push_back(x);
    if (f.size() > 38) found = {std::stoi(f[41 - 3]), std::stoi(f[19 - 3])};
  }
  closedir(dir);
  return found;
}

Co<void> nap() { co_await sleep_for(2ms); }

// The coroutine timer thread is started by the first thread that arms a
// timer, here a worker that made itself SCHED_BATCH at nice +7 (as crewd's
// jobs workers lower themselves). It fires every worker's timers, so it
// takes the main thread's scheduling instead: the policy always, the nice
// value where lowering it is allowed (CAP_SYS_NICE, here as root).
TEST(CoroTask, TheTimerThreadRunsAsTheMainThreadNotAsTheWorkerThatStartedIt) {
  Watchdog dog;
  PoolOptions o = fixed_workers("lowered", 1);
  o.on_worker_start = [](std::uint64_t) {
    const sched_param p{};
    ASSERT_EQ(sched_setscheduler(0, SCHED_BATCH, &p), 0);
    ASSERT_EQ(setpriority(PRIO_PROCESS, 0, 7), 0);  // the calling thread's on Linux
  };
  Pool pool(o);
  spawn(pool, nap()).get();
  const auto [policy, nice] = policy_and_nice_of("crew-coro-timer");
  ASSERT_NE(policy, -1) << "no coroutine timer thread";
  EXPECT_EQ(policy, sched_getscheduler(0));  // the main thread's: this one
  if (geteuid() == 0) {
    EXPECT_EQ(nice, getpriority(PRIO_PROCESS, 0));
  } else {
    EXPECT_EQ(nice, 7);  // no right to lower it
  }
}

}  // namespace
}  // namespace crew

// Tests of the submission paths across the pool configurations that route
// them differently: priority levels (one queue, or one per level), queue
// shards (one, or several), task observers (none: plain and counted cells;
// one: observed cells with timings). Every path (post, try_post, submit,
// try_submit, submit_wait, Group::submit without and with a handle) runs
// from outside the pool (shared queue) and from a worker (its local queue),
// and every task must run exactly once and be counted exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "crew/group.hpp"
#include "crew/observer.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Watchdog;

constexpr int kTasks = 200;

enum class Path : std::uint8_t {
  post,
  try_post,
  submit,
  try_submit,
  submit_wait,
  group_submit,        // unnamed: a counted cell when no observer wants task events
  group_submit_named,  // named: a task with a state and a handle the group keeps
};

enum class From : std::uint8_t { outside, worker };

struct Config {
  std::size_t levels;
  std::size_t shards;
  bool observed;
};

std::ostream& operator<<(std::ostream& os, Path p) {
  constexpr const char* kNames[] = {
      "post",         "try_post",          "submit", "try_submit", "submit_wait",
      "group_submit", "group_submit_named"};
  return os << kNames[static_cast<int>(p)];
}

// Counts every task event; each task that runs is started and finished once.
class TaskCounter final : public Observer {
 public:
  [[nodiscard]] std::uint32_t events() const noexcept override {
    return task_enqueued | task_started | task_finished | task_rejected;
  }
  void on_task_enqueued(const TaskEvent&) noexcept override { enqueued.fetch_add(1); }
  void on_task_started(const TaskEvent&, std::chrono::nanoseconds) noexcept override {
    started.fetch_add(1);
  }
  void on_task_finished(const TaskEvent&, TaskStatus outcome, std::chrono::nanoseconds,
                        std::chrono::nanoseconds) noexcept override {
    finished.fetch_add(1);
    if (outcome == TaskStatus::succeeded) succeeded.fetch_add(1);
  }
  void on_task_rejected(const TaskEvent&, TaskStatus, Errc, Admission) noexcept override {
    rejected.fetch_add(1);
  }

  std::atomic<std::uint64_t> enqueued{0}, started{0}, finished{0}, succeeded{0}, rejected{0};
};

class Submission : public ::testing::TestWithParam<std::tuple<Config, Path, From>> {
 protected:
  Submission()
      : config_(std::get<0>(GetParam())),
        path_(std::get<1>(GetParam())),
        from_(std::get<2>(GetParam())),
        runs_(kTasks) {}

  PoolOptions options() const {
    PoolOptions o = test::fixed_workers("submission", 2);
    o.queue_capacity = 4 * kTasks;  // per level: never full here
    o.queue_shards = config_.shards;
    o.priority_levels = config_.levels;
    if (config_.observed) o.observers.push_back(observer_);
    return o;
  }

  // Task i's options: every other task takes the call without options (the
  // plain overload where there is one), the others a priority level in turn.
  TaskOptions options_of(int i) const {
    TaskOptions o;
    o.priority = static_cast<std::uint8_t>(static_cast<std::size_t>(i) % config_.levels);
    if (path_ == Path::group_submit_named) o.name = "task-" + std::to_string(i);
    return o;
  }
  bool plain_call(int i) const { return i % 2 == 0 && path_ != Path::group_submit_named; }

  // Submits the kTasks tasks along path_; runs on the test's thread or on a
  // worker. Handles go to handles_, submit_wait's values are checked here.
  void submit_all(Pool& pool, Group& group) {
    for (int i = 0; i < kTasks; ++i) {
      auto body = [this, i] {
        runs_[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
        return i;
      };
      auto detached = [body] { (void)body(); };
      const bool plain = plain_call(i);
      switch (path_) {
        case Path::post:
          EXPECT_EQ(plain ? pool.post(detached) : pool.post(detached, options_of(i)),
                    Admission::accepted);
          break;
        case Path::try_post:
          EXPECT_EQ(plain ? pool.try_post(detached) : pool.try_post(detached, options_of(i)),
                    Admission::accepted);
          break;
        case Path::submit:
          handles_.push_back(plain ? pool.submit(body) : pool.submit(body, options_of(i)));
          break;
        case Path::try_submit:
          handles_.push_back(plain ? pool.try_submit(body) : pool.try_submit(body, options_of(i)));
          break;
        case Path::submit_wait:
          EXPECT_EQ(plain ? pool.submit_wait(body) : pool.submit_wait(body, options_of(i)), i);
          break;
        case Path::group_submit:
        case Path::group_submit_named:
          EXPECT_EQ(plain ? group.submit(detached) : group.submit(detached, options_of(i)),
                    Admission::accepted);
          break;
      }
    }
  }

  const Config config_;
  const Path path_;
  const From from_;
  std::vector<std::atomic<int>> runs_;
  std::vector<Task<int>> handles_;
  std::shared_ptr<TaskCounter> observer_ = std::make_shared<TaskCounter>();
};

TEST_P(Submission, EveryTaskRunsExactlyOnceAndTheStatsAddUp) {
  Watchdog dog;
  Pool pool(options());
  std::uint64_t expected = kTasks;
  {
    Group group(pool);
    if (from_ == From::outside) {
      submit_all(pool, group);
    } else {
      ++expected;  // the task that submits
      Task<void> outer = pool.submit([&] { submit_all(pool, group); });
      ASSERT_TRUE(outer.wait_for(20s * test::kSlowdown)) << "the submitting task never ended";
      outer.get();
    }
    for (std::size_t i = 0; i < handles_.size(); ++i) {
      ASSERT_TRUE(handles_[i].wait_for(20s * test::kSlowdown)) << "task " << i << " never ended";
      EXPECT_EQ(handles_[i].get(), static_cast<int>(i));
    }
    ASSERT_TRUE(group.wait_for(20s * test::kSlowdown)) << "the group never finished";
    const GroupStats gs = group.stats();
    const bool grouped = path_ == Path::group_submit || path_ == Path::group_submit_named;
    EXPECT_EQ(gs.submitted, grouped ? kTasks : 0u);
    EXPECT_EQ(gs.outcomes.succeeded, gs.submitted);
    EXPECT_EQ(gs.outcomes.total(), gs.submitted);
    EXPECT_EQ(gs.pending, 0u);
  }
  ASSERT_TRUE(pool.wait_idle(20s * test::kSlowdown)) << "the pool never became idle";

  for (std::size_t i = 0; i < runs_.size(); ++i) {
    EXPECT_EQ(runs_[i].load(), 1) << "task " << i;
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.submitted, expected);
  EXPECT_EQ(s.outcomes.succeeded, expected);
  EXPECT_EQ(s.outcomes.total(), expected);
  // A task a waiting worker ran itself (submit_wait with priority levels:
  // the task went to the shared queue) leaves its cell there until a worker
  // pops and drops it, so the queue empties shortly after, not at once.
  EXPECT_TRUE(eventually([&] { return pool.stats().queued == 0; }))
      << pool.stats().queued << " cells still queued";
  if (config_.observed) {
    // Events may trail the counters the pool reads for wait_idle().
    EXPECT_TRUE(eventually([&] { return observer_->finished.load() == expected; }))
        << observer_->finished.load() << " of " << expected << " finished events";
    EXPECT_EQ(observer_->started.load(), expected);
    EXPECT_EQ(observer_->succeeded.load(), expected);
    EXPECT_EQ(observer_->enqueued.load(), expected);
    EXPECT_EQ(observer_->rejected.load(), 0u);
  } else {
    EXPECT_EQ(observer_->finished.load(), 0u);  // installed nowhere
  }
}

std::string name_of(const ::testing::TestParamInfo<Submission::ParamType>& info) {
  const auto& [config, path, from] = info.param;
  std::ostringstream os;
  os << path << (from == From::outside ? "_outside" : "_worker") << "_levels" << config.levels
     << "_shards" << config.shards << (config.observed ? "_observed" : "_plain");
  return os.str();
}

INSTANTIATE_TEST_SUITE_P(
    LevelsShardsObservers, Submission,
    ::testing::Combine(::testing::Values(Config{1, 1, false}, Config{1, 1, true},
                                         Config{1, 4, false}, Config{1, 4, true},
                                         Config{3, 1, false}, Config{3, 1, true},
                                         Config{3, 4, false}, Config{3, 4, true}),
                       ::testing::Values(Path::post, Path::try_post, Path::submit, Path::try_submit,
                                         Path::submit_wait, Path::group_submit,
                                         Path::group_submit_named),
                       ::testing::Values(From::outside, From::worker)),
    name_of);

// Every outcome belongs to a counted submission: a monitor reading stats()
// while producers push into an unbounded pool (its queue spills past the
// ring) never sees more outcomes than submissions. A spill push is counted
// before it is published, as a ring push is.
TEST(SubmissionCounts, OutcomesNeverExceedSubmissionsWhileTheQueueSpills) {
  Watchdog dog(60s);
  Pool pool({.name = "spill", .max_workers = 4, .queue_capacity = kUnbounded, .queue_shards = 1});
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> bad{0};
  std::thread monitor([&] {
    while (!done.load()) {
      const PoolStats s = pool.stats();
      if (s.outcomes.total() > s.submitted) bad.fetch_add(1);
    }
  });
  std::vector<std::thread> producers;
  const int per = test::kSlowdown > 1 ? 20'000 : 100'000;
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&] {
      for (int i = 0; i < per; ++i) (void)pool.post([] {});
    });
  }
  for (auto& t : producers) t.join();
  ASSERT_TRUE(pool.wait_idle(30s));
  done = true;
  monitor.join();
  EXPECT_EQ(bad.load(), 0u);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.outcomes.succeeded, s.submitted);
}

// A push from outside the pool goes inline to the ring of the producer's
// home shard; once that ring is full, to the other shards (out of line).
// So one thread fills the whole queue of a paused pool before it is full,
// and a second thread, with another home shard, finds it full too.
TEST(SubmissionShards, OneProducerFillsEveryShardBeforeTheQueueIsFull) {
  Watchdog dog;
  constexpr int kCapacity = 64;  // 16 slots in each of 4 shards
  Pool pool({.name = "shards", .max_workers = 1, .queue_capacity = kCapacity, .queue_shards = 4});
  pool.pause();
  std::atomic<int> ran{0};
  for (int i = 0; i < kCapacity; ++i)
    ASSERT_EQ(pool.try_post([&] { ran.fetch_add(1); }), Admission::accepted) << "task " << i;
  EXPECT_EQ(pool.try_post([&] { ran.fetch_add(1); }), Admission::full);
  std::thread other([&] { EXPECT_EQ(pool.try_post([&] { ran.fetch_add(1); }), Admission::full); });
  other.join();
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(ran.load(), kCapacity);
  EXPECT_EQ(pool.stats().outcomes.rejected, 2u);
}

}  // namespace
}  // namespace crew

// The pool's timers (src/engine/timer_heap.hpp: the lane for deadlines armed in
// order, the heap for the rest) against a plain model: random arms, disarms
// and firings, the answers checked after each step, and the references
// they hold handed back exactly once.
#include "timer_heap.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "crew/detail/task_state.hpp"
#include "test_util.hpp"

namespace crew::detail {
namespace {

using test::Watchdog;

std::vector<TaskStateBase*> states_of(const std::vector<TimerHeap::Due>& due) {
  std::vector<TaskStateBase*> out;
  for (const auto& d : due) out.push_back(d.state);
  return out;
}

struct Nop {
  void operator()() const noexcept {}
};

// A state with Extras, as every task with a deadline has; the test holds
// one reference of its own until the end.
TaskStateBase* new_state() {
  auto* s = new TaskState<void, Nop>(Nop{});
  s->adopt_extras(std::make_unique<TaskStateBase::Extras>());
  return s;
}

// Every entry of take_all, from both places.
std::vector<TimerHeap::Entry> all_of(TimerHeap::Armed a) {
  std::vector<TimerHeap::Entry> all = std::move(a.heap);
  all.insert(all.end(), a.lane.begin(), a.lane.end());
  return all;
}

// `in_order`: the share of arms (of 8) whose deadline is the latest yet, as
// tasks of one timeout arm theirs; the rest are random, so both the lane
// and the heap hold entries. `slack`: the lane's compaction threshold.
void random_steps_match_a_model(int in_order, std::size_t slack, std::uint64_t seed) {
  constexpr int kStates = 300;
  constexpr int kSteps = 20'000;
  std::mt19937_64 rng(seed);
  std::vector<TaskStateBase*> states;
  for (int i = 0; i < kStates; ++i) states.push_back(new_state());
  // The model: armed state -> its deadline.
  std::map<TaskStateBase*, std::int64_t> armed;
  TimerHeap heap(slack);
  std::int64_t latest = 0;
  std::int64_t now = 0;
  auto model_next = [&] {
    std::int64_t next = TimerHeap::kNever;
    for (const auto& [s, at] : armed) next = std::min(next, at);
    return next;
  };
  for (int step = 0; step < kSteps; ++step) {
    TaskStateBase* s = states[rng() % kStates];
    switch (rng() % 4) {
      case 0:
      case 1:
        if (!armed.contains(s)) {
          // Few distinct deadlines, so that ties are common.
          std::int64_t at = now + static_cast<std::int64_t>(rng() % 64);
          if (static_cast<int>(rng() % 8) < in_order) at = std::max(at, latest);
          latest = std::max(latest, at);
          const std::int64_t before = model_next();
          s->add_ref();  // the heap's
          const bool earliest = heap.push(s, at, /*exec=*/false);
          armed[s] = at;
          // Earliest: strictly before every other deadline (a tie stays
          // below the entry already on top).
          ASSERT_EQ(earliest, at < before) << "step " << step;
        }
        break;
      case 2: {
        const bool was = heap.erase(s);
        ASSERT_EQ(was, armed.contains(s)) << "step " << step;
        if (was) {
          armed.erase(s);
          s->release();
        }
        break;
      }
      case 3: {
        now += static_cast<std::int64_t>(rng() % 8);
        std::vector<TimerHeap::Due> due;
        const std::int64_t next = heap.pop_due(now, due);
        std::vector<TaskStateBase*> expected;
        for (const auto& [st, at] : armed) {
          if (at <= now) expected.push_back(st);
        }
        std::vector<TaskStateBase*> got = states_of(due);
        std::sort(got.begin(), got.end());
        std::sort(expected.begin(), expected.end());
        ASSERT_EQ(got, expected) << "step " << step;
        for (const auto& [d, exec] : due) {
          armed.erase(d);
          d->release();
        }
        ASSERT_EQ(next, model_next()) << "step " << step;
        break;
      }
    }
  }
  // Whatever is still armed comes back once, and each state is left with
  // the test's reference alone.
  std::vector<TimerHeap::Entry> rest = all_of(heap.take_all());
  ASSERT_EQ(rest.size(), armed.size());
  for (const TimerHeap::Entry& e : rest) {
    ASSERT_EQ(armed.at(e.state), e.at_ns);
    ASSERT_EQ(e.state->extras()->heap_index, TaskStateBase::kNotInHeap);
    e.state->release();
  }
  EXPECT_FALSE(heap.erase(states[0]));
  for (TaskStateBase* s : states) s->release();
}

TEST(TimerHeap, RandomArmsDisarmsAndFiringsMatchAModel) {
  Watchdog dog;
  random_steps_match_a_model(/*in_order=*/0, TimerHeap::kLaneSlack, 12345);
}

TEST(TimerHeap, MostlyOrderedArmsMatchAModel) {
  Watchdog dog;
  random_steps_match_a_model(/*in_order=*/7, TimerHeap::kLaneSlack, 777);
  random_steps_match_a_model(/*in_order=*/7, /*slack=*/4, 778);
  random_steps_match_a_model(/*in_order=*/8, /*slack=*/0, 779);
}

// push() says whether the new deadline is the earliest of both places.
TEST(TimerHeap, EarliestLooksAtTheLaneAndTheHeap) {
  Watchdog dog;
  TimerHeap heap;
  std::vector<TaskStateBase*> states;
  auto arm = [&](std::int64_t at) {
    TaskStateBase* s = new_state();
    s->add_ref();  // the heap's
    states.push_back(s);
    return heap.push(s, at, /*exec=*/false);
  };
  EXPECT_TRUE(arm(10));   // the lane's first
  EXPECT_TRUE(arm(5));    // before the lane's last: the heap, and earliest
  EXPECT_FALSE(arm(20));  // the lane
  EXPECT_FALSE(arm(7));   // the heap, after its top
  EXPECT_FALSE(arm(5));   // a tie stays below
  // The lane emptied, the heap's 5 still armed: a new lane entry at 6 is
  // not the earliest, at 4 it is.
  for (std::size_t i : {0U, 2U}) {
    ASSERT_TRUE(heap.erase(states[i]));
    states[i]->release();
  }
  EXPECT_EQ(heap.lane_size_for_testing(), 0U);
  EXPECT_FALSE(arm(6));
  EXPECT_EQ(heap.lane_size_for_testing(), 1U);
  std::vector<TimerHeap::Due> due;
  EXPECT_EQ(heap.pop_due(5, due), 6);
  EXPECT_EQ(due.size(), 2U);  // the two at 5
  EXPECT_EQ(heap.pop_due(6, due), 7);
  EXPECT_EQ(due.size(), 3U);
  EXPECT_EQ(due.back().state, states.back());  // the lane's 6
  EXPECT_TRUE(arm(4));
  for (const auto& d : due) d.state->release();
  for (const TimerHeap::Entry& e : all_of(heap.take_all())) e.state->release();
  for (TaskStateBase* s : states) s->release();
}

// Deadlines armed in order and disarmed in any order but the first (a task
// stuck at the front while later ones start): the cleared entries behind
// it are compacted away, so the lane stays within twice the armed tasks
// plus the slack, and each disarm finds its own entry afterwards.
TEST(TimerHeap, LaneStaysBoundedBehindALiveFront) {
  Watchdog dog;
  constexpr std::size_t kSlack = 16;
  TimerHeap heap(kSlack);
  TaskStateBase* front = new_state();
  front->add_ref();
  EXPECT_TRUE(heap.push(front, 1, /*exec=*/false));
  std::mt19937_64 rng(3);
  std::vector<TaskStateBase*> live;
  for (int i = 0; i < 20'000; ++i) {
    TaskStateBase* s = new_state();
    s->add_ref();  // the heap's
    EXPECT_FALSE(heap.push(s, 2 + i, /*exec=*/false)) << i;
    live.push_back(s);
    if (live.size() > 50) {
      const std::size_t k = rng() % live.size();
      TaskStateBase* gone = live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      ASSERT_TRUE(heap.erase(gone)) << i;
      ASSERT_FALSE(heap.erase(gone)) << i;
      gone->release();  // the heap's
      gone->release();  // the test's
    }
    ASSERT_LE(heap.lane_size_for_testing(), 2 * (live.size() + 1) + kSlack + 1) << i;
  }
  // Firing everything hands back the front, then the rest in order.
  std::vector<TimerHeap::Due> due;
  EXPECT_EQ(heap.pop_due(TimerHeap::kNever - 1, due), TimerHeap::kNever);
  ASSERT_EQ(due.size(), live.size() + 1);
  EXPECT_EQ(due[0].state, front);
  for (std::size_t i = 0; i < live.size(); ++i) EXPECT_EQ(due[i + 1].state, live[i]) << i;
  EXPECT_EQ(heap.lane_size_for_testing(), 0U);
  for (const auto& [s, exec] : due) {
    s->release();  // the heap's
    s->release();  // the test's
  }
}

// Due entries come out in deadline order, earliest first.
TEST(TimerHeap, PopDueHandsOverInDeadlineOrder) {
  Watchdog dog;
  std::mt19937_64 rng(7);
  TimerHeap heap;
  std::map<TaskStateBase*, std::int64_t> at;
  for (int i = 0; i < 1000; ++i) {
    TaskStateBase* s = new_state();
    at[s] = static_cast<std::int64_t>(rng() % 100'000);
    s->add_ref();  // the heap's
    (void)heap.push(s, at[s], /*exec=*/false);
  }
  std::vector<TimerHeap::Due> due;
  // Half now, then the rest: each call returns the next deadline left.
  std::int64_t next_left = TimerHeap::kNever;
  for (const auto& [s, when] : at) {
    if (when > 50'000) next_left = std::min(next_left, when);
  }
  EXPECT_EQ(heap.pop_due(50'000, due), next_left);
  EXPECT_EQ(heap.pop_due(TimerHeap::kNever - 1, due), TimerHeap::kNever);
  ASSERT_EQ(due.size(), at.size());
  for (std::size_t i = 1; i < due.size(); ++i)
    ASSERT_LE(at[due[i - 1].state], at[due[i].state]) << i;
  for (const auto& d : due) d.state->release();
  for (const auto& [s, when] : at) s->release();
}

// Arms and disarms from several threads at once, as submitters and workers
// do, with the supervisor's firings beside them: every reference the heap
// took comes back exactly once (a lost or doubled one frees a state too
// early or never, which the sanitizer builds report).
TEST(TimerHeap, ConcurrentArmsDisarmsAndFiringsHandBackEveryReference) {
  Watchdog dog;
  constexpr int kThreads = 3;
  constexpr int kPerThread = 20'000;
  TimerHeap heap;
  std::atomic<bool> done{false};
  std::atomic<std::int64_t> fired{0};
  std::thread supervisor([&] {
    std::int64_t now = 0;
    std::vector<TimerHeap::Due> due;
    while (!done.load(std::memory_order_acquire)) {
      now += 50;
      due.clear();
      (void)heap.pop_due(now, due);
      for (const auto& d : due) {
        fired.fetch_add(1, std::memory_order_relaxed);
        d.state->release();
      }
    }
  });
  std::atomic<std::int64_t> disarmed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      for (int i = 0; i < kPerThread; ++i) {
        TaskStateBase* s = new_state();
        s->add_ref();  // the heap's
        (void)heap.push(s, static_cast<std::int64_t>(rng() % 1'000'000), /*exec=*/false);
        if (heap.erase(s)) {
          disarmed.fetch_add(1, std::memory_order_relaxed);
          s->release();
        }
        s->release();  // the test's
      }
    });
  }
  for (std::thread& th : threads) th.join();
  done.store(true, std::memory_order_release);
  supervisor.join();
  std::vector<TimerHeap::Entry> rest = all_of(heap.take_all());
  for (const TimerHeap::Entry& e : rest) e.state->release();
  EXPECT_EQ(disarmed.load() + fired.load() + static_cast<std::int64_t>(rest.size()),
            std::int64_t{kThreads} * kPerThread);
}

}  // namespace
}  // namespace crew::detail

// The pool's timer heap (src/timer_heap.hpp) against a plain model: random
// arms, disarms and firings, the heap's answers checked after each step,
// and the references it holds handed back exactly once.
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

TEST(TimerHeap, RandomArmsDisarmsAndFiringsMatchAModel) {
  Watchdog dog;
  constexpr int kStates = 300;
  constexpr int kSteps = 20'000;
  std::mt19937_64 rng(12345);
  std::vector<TaskStateBase*> states;
  for (int i = 0; i < kStates; ++i) states.push_back(new_state());
  // The model: armed state -> its deadline.
  std::map<TaskStateBase*, std::int64_t> armed;
  TimerHeap heap;
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
          const std::int64_t at = now + static_cast<std::int64_t>(rng() % 64);
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
        std::vector<TaskStateBase*> due;
        const std::int64_t next = heap.pop_due(now, due);
        std::vector<TaskStateBase*> expected;
        for (const auto& [st, at] : armed) {
          if (at <= now) expected.push_back(st);
        }
        std::vector<TaskStateBase*> got = due;
        std::sort(got.begin(), got.end());
        std::sort(expected.begin(), expected.end());
        ASSERT_EQ(got, expected) << "step " << step;
        for (TaskStateBase* d : due) {
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
  std::vector<TimerHeap::Entry> rest = heap.take_all();
  ASSERT_EQ(rest.size(), armed.size());
  for (const TimerHeap::Entry& e : rest) {
    ASSERT_EQ(armed.at(e.state), e.at_ns);
    ASSERT_EQ(e.state->extras()->heap_index, TaskStateBase::kNotInHeap);
    e.state->release();
  }
  EXPECT_FALSE(heap.erase(states[0]));
  for (TaskStateBase* s : states) s->release();
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
  std::vector<TaskStateBase*> due;
  // Half now, then the rest: each call returns the next deadline left.
  std::int64_t next_left = TimerHeap::kNever;
  for (const auto& [s, when] : at) {
    if (when > 50'000) next_left = std::min(next_left, when);
  }
  EXPECT_EQ(heap.pop_due(50'000, due), next_left);
  EXPECT_EQ(heap.pop_due(TimerHeap::kNever - 1, due), TimerHeap::kNever);
  ASSERT_EQ(due.size(), at.size());
  for (std::size_t i = 1; i < due.size(); ++i) ASSERT_LE(at[due[i - 1]], at[due[i]]) << i;
  for (TaskStateBase* s : due) s->release();
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
    std::vector<TaskStateBase*> due;
    while (!done.load(std::memory_order_acquire)) {
      now += 50;
      due.clear();
      (void)heap.pop_due(now, due);
      for (TaskStateBase* s : due) {
        fired.fetch_add(1, std::memory_order_relaxed);
        s->release();
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
  std::vector<TimerHeap::Entry> rest = heap.take_all();
  for (const TimerHeap::Entry& e : rest) e.state->release();
  EXPECT_EQ(disarmed.load() + fired.load() + static_cast<std::int64_t>(rest.size()),
            std::int64_t{kThreads} * kPerThread);
}

}  // namespace
}  // namespace crew::detail

// Tests of the pool's shared queue (crew/detail/queues.hpp), one class
// at a time: Ring (capacity, power of two or not; wrap-around over many
// laps; full and room again; only published cells taken; batches; FIFO per
// producer; many producers and consumers), SpillQueue, Shard (ring and
// spill in one order), TaskQueue (capacity split across shards) and
// Queues (the aging rule of priority levels).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "crew/detail/cell.hpp"
#include "crew/detail/queues.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using detail::Cell;
using detail::Queues;
using detail::Ring;
using detail::Shard;
using detail::SpillQueue;
using detail::TaskQueue;
using test::Watchdog;

constexpr std::uint64_t kNoValue = ~std::uint64_t{0};

// The value the last cell run on this thread carried.
thread_local std::uint64_t t_value = kNoValue;

// A fill that puts a cell carrying `v` in the slot it is given.
auto carrying(std::uint64_t v) {
  return [v](Cell& c) noexcept { c.emplace([v] { t_value = v; }); };
}

// Runs (and empties) a popped cell: the value it carried.
std::uint64_t value_of(Cell& c) {
  t_value = kNoValue;
  (void)c.invoke_and_destroy();
  return t_value;
}

template <class Queue>
std::optional<std::uint64_t> pop_value(Queue& q) {
  Cell c;
  if (!q.try_pop(c)) return std::nullopt;
  return value_of(c);
}

// Pushes `v`; SpillQueue takes its fill by lvalue reference.
template <class Queue>
bool push_value(Queue& q, std::uint64_t v) {
  auto fill = carrying(v);
  return q.try_push(fill);
}

class RingCapacity : public ::testing::TestWithParam<std::size_t> {};

TEST_P(RingCapacity, HoldsExactlyItsCapacityAndGivesItBackInOrder) {
  const std::size_t cap = GetParam();
  Ring r(cap);
  EXPECT_EQ(r.capacity(), cap);
  for (std::uint64_t i = 0; i < cap; ++i) ASSERT_TRUE(push_value(r, i)) << i;
  EXPECT_FALSE(push_value(r, cap)) << "a full ring took one more";
  EXPECT_EQ(r.size(), cap);
  EXPECT_EQ(r.pushed(), cap);
  for (std::uint64_t i = 0; i < cap; ++i) EXPECT_EQ(pop_value(r), i);
  EXPECT_EQ(pop_value(r), std::nullopt);
  EXPECT_EQ(r.size(), 0u);
}

TEST_P(RingCapacity, AFullRingTakesOneMoreAfterOnePop) {
  const std::size_t cap = GetParam();
  Ring r(cap);
  for (std::uint64_t i = 0; i < cap; ++i) ASSERT_TRUE(push_value(r, i));
  ASSERT_FALSE(push_value(r, 1000));
  EXPECT_EQ(pop_value(r), 0u);
  EXPECT_TRUE(push_value(r, cap));
  EXPECT_FALSE(push_value(r, 1001));
  for (std::uint64_t i = 1; i <= cap; ++i) EXPECT_EQ(pop_value(r), i);
  EXPECT_EQ(pop_value(r), std::nullopt);
  EXPECT_EQ(r.pushed(), cap + 1);
}

// Every slot goes through thousands of laps (its turn number counting up),
// half full all along so that the head and tail are in different laps
// most of the time; order and counts stay exact.
TEST_P(RingCapacity, WrapsAroundOverManyLaps) {
  const std::size_t cap = GetParam();
  constexpr std::uint64_t kLaps = 5000;
  Ring r(cap);
  const std::uint64_t ahead = cap / 2;
  std::uint64_t next_in = 0;
  std::uint64_t next_out = 0;
  for (; next_in < ahead; ++next_in) ASSERT_TRUE(push_value(r, next_in));
  for (std::uint64_t k = 0; k < kLaps * cap; ++k) {
    ASSERT_TRUE(push_value(r, next_in)) << "at " << next_in;
    ++next_in;
    ASSERT_EQ(pop_value(r), next_out) << "lap " << k / cap;
    ++next_out;
    ASSERT_EQ(r.size(), ahead);
  }
  while (next_out < next_in) ASSERT_EQ(pop_value(r), next_out++);
  EXPECT_EQ(pop_value(r), std::nullopt);
  EXPECT_EQ(r.pushed(), ahead + kLaps * cap);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingCapacity, ::testing::Values(1u, 2u, 5u, 8u, 12u, 64u, 100u),
                         [](const auto& p) { return "cap" + std::to_string(p.param); });

// A claimed slot whose cell is still being written is counted by size()
// but not popped (Ring::published): not alone, and not as part of a
// batch, even with published cells after it. Here the claim stays open
// for as long as the fill runs, and the fill looks at the ring.
TEST(Ring, TakesOnlyPublishedCells) {
  Ring r(8);
  ASSERT_TRUE(push_value(r, 0));
  std::size_t size_while_writing = 0;
  std::size_t batch_while_writing = 0;
  std::uint64_t first_while_writing = kNoValue;
  bool popped_behind = true;
  bool pushed_behind = false;
  ASSERT_TRUE(r.try_push([&](Cell& c) noexcept {
    // Slot 1 is claimed, not published; slot 2 is pushed behind it.
    pushed_behind = push_value(r, 2);
    size_while_writing = r.size();
    Cell out;
    batch_while_writing = r.try_pop_batch(
        out, [](std::size_t) { return true; }, [](Cell&) noexcept {});
    if (batch_while_writing == 1) first_while_writing = value_of(out);
    Cell none;
    popped_behind = r.try_pop(none);
    c.emplace([] { t_value = 1; });
  }));
  EXPECT_TRUE(pushed_behind);
  EXPECT_EQ(size_while_writing, 3u);
  EXPECT_EQ(batch_while_writing, 1u) << "the batch went past the unpublished cell";
  EXPECT_EQ(first_while_writing, 0u);
  EXPECT_FALSE(popped_behind) << "a pop took a cell past the unpublished one";
  // Published now: both come out, in order, in one batch.
  Cell out;
  std::vector<std::uint64_t> sunk;
  EXPECT_EQ(r.try_pop_batch(
                out, [](std::size_t) { return true; },
                [&](Cell& c) noexcept {
                  Cell moved;
                  c.relocate_to(moved);
                  sunk.push_back(value_of(moved));
                }),
            2u);
  EXPECT_EQ(value_of(out), 1u);
  EXPECT_EQ(sunk, std::vector<std::uint64_t>{2});
  EXPECT_EQ(r.size(), 0u);
}

// A batch takes what more(n) allows: the oldest into `out`, the others to
// the sink newest first (a stack that pops them oldest first).
TEST(Ring, ABatchTakesWhatMoreAllowsNewestFirstIntoTheSink) {
  Ring r(16);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(push_value(r, i));
  Cell out;
  std::vector<std::uint64_t> sunk;
  auto sink = [&](Cell& c) noexcept {
    Cell moved;
    c.relocate_to(moved);
    sunk.push_back(value_of(moved));
  };
  EXPECT_EQ(r.try_pop_batch(
                out, [](std::size_t n) { return n < 4; }, sink),
            4u);
  EXPECT_EQ(value_of(out), 0u);
  EXPECT_EQ(sunk, (std::vector<std::uint64_t>{3, 2, 1}));
  EXPECT_EQ(r.size(), 6u);
  for (std::uint64_t i = 4; i < 10; ++i) EXPECT_EQ(pop_value(r), i);
  EXPECT_EQ(r.try_pop_batch(
                out, [](std::size_t) { return true; }, sink),
            0u);
}

// Values of the threaded tests: producer p's i-th value.
constexpr std::uint64_t value(std::uint64_t producer, std::uint64_t i) {
  return producer << 32 | i;
}

// Several producers, one consumer, a small ring (always wrapping, often
// full): the consumer sees each producer's values in the order pushed,
// none missing.
TEST(RingRace, OneConsumerSeesEachProducersValuesInOrder) {
  Watchdog dog(60s);
  constexpr std::size_t kProducers = 3;
  constexpr std::uint64_t kPer = test::kSlowdown > 1 ? 5'000 : 50'000;
  Ring r(8);
  std::vector<std::thread> producers;
  for (std::uint64_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&r, p] {
      for (std::uint64_t i = 0; i < kPer; ++i) {
        while (!push_value(r, value(p, i))) std::this_thread::yield();
      }
    });
  }
  std::vector<std::uint64_t> next(kProducers, 0);
  std::uint64_t out_of_order = 0;
  for (std::uint64_t got = 0; got < kProducers * kPer;) {
    const std::optional<std::uint64_t> v = pop_value(r);
    if (!v) {
      std::this_thread::yield();
      continue;
    }
    ++got;
    const std::uint64_t p = *v >> 32;
    const std::uint64_t i = *v & 0xffffffffu;
    if (p >= kProducers || i != next[p]) {
      ++out_of_order;
      continue;
    }
    next[p] = i + 1;
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(out_of_order, 0u);
  for (std::size_t p = 0; p < kProducers; ++p) EXPECT_EQ(next[p], kPer) << "producer " << p;
  EXPECT_EQ(pop_value(r), std::nullopt);
  EXPECT_EQ(r.pushed(), kProducers * kPer);
}

// Many producers and consumers on rings of a power-of-two size and not:
// every value is popped exactly once, and each consumer sees each
// producer's values in increasing order (a consumer's claims of the head
// are in order, and so are a producer's claims of the tail).
class RingManyToMany : public ::testing::TestWithParam<std::size_t> {};

TEST_P(RingManyToMany, EveryValueIsPoppedExactlyOnce) {
  Watchdog dog(60s);
  constexpr std::size_t kProducers = 3;
  constexpr std::size_t kConsumers = 3;
  constexpr std::uint64_t kPer = test::kSlowdown > 1 ? 5'000 : 50'000;
  const std::uint64_t total = kProducers * kPer;
  Ring r(GetParam());
  std::vector<std::atomic<std::uint8_t>> taken(total);
  std::atomic<std::uint64_t> popped{0};
  std::atomic<std::uint64_t> out_of_order{0};
  std::vector<std::thread> threads;
  for (std::uint64_t p = 0; p < kProducers; ++p) {
    threads.emplace_back([&r, p] {
      for (std::uint64_t i = 0; i < kPer; ++i) {
        while (!push_value(r, value(p, i))) std::this_thread::yield();
      }
    });
  }
  for (std::size_t c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&] {
      std::vector<std::uint64_t> last(kProducers, kNoValue);
      while (popped.load(std::memory_order_relaxed) < total) {
        const std::optional<std::uint64_t> v = pop_value(r);
        if (!v) {
          std::this_thread::yield();
          continue;
        }
        const std::uint64_t p = *v >> 32;
        const std::uint64_t i = *v & 0xffffffffu;
        if (p >= kProducers || i >= kPer) {
          out_of_order.fetch_add(1);
          continue;
        }
        if (last[p] != kNoValue && i <= last[p]) out_of_order.fetch_add(1);
        last[p] = i;
        taken[p * kPer + i].fetch_add(1);
        popped.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::uint64_t wrong = 0;
  for (const auto& t : taken) {
    if (t.load() != 1) ++wrong;
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(out_of_order.load(), 0u);
  EXPECT_EQ(popped.load(), total);
  EXPECT_EQ(r.pushed(), total);
  EXPECT_EQ(r.size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingManyToMany, ::testing::Values(16u, 12u),
                         [](const auto& p) { return "cap" + std::to_string(p.param); });

// Across blocks of cells (254 a block) and with a bound.
TEST(SpillQueue, KeepsOrderAcrossBlocksAndHoldsItsCapacity) {
  SpillQueue bounded(600);
  for (std::uint64_t i = 0; i < 600; ++i) ASSERT_TRUE(push_value(bounded, i)) << i;
  EXPECT_FALSE(push_value(bounded, 600));
  EXPECT_EQ(bounded.size(), 600u);
  EXPECT_EQ(pop_value(bounded), 0u);
  EXPECT_TRUE(push_value(bounded, 600)) << "room again after a pop";
  for (std::uint64_t i = 1; i <= 600; ++i) ASSERT_EQ(pop_value(bounded), i);
  EXPECT_EQ(pop_value(bounded), std::nullopt);
  EXPECT_FALSE(bounded.may_have_items());
  EXPECT_EQ(bounded.pushed(), 601u);

  SpillQueue unbounded(SpillQueue::kUnboundedSpill);
  for (std::uint64_t i = 0; i < 2000; ++i) ASSERT_TRUE(push_value(unbounded, i));
  EXPECT_TRUE(unbounded.may_have_items());
  for (std::uint64_t i = 0; i < 2000; ++i) ASSERT_EQ(pop_value(unbounded), i);
  EXPECT_EQ(unbounded.size(), 0u);
}

// While the spill holds cells, new ones go behind them, not to the ring
// that has room again: one order for the shard.
TEST(Shard, NewCellsGoBehindTheSpillSoTheOrderStaysFifo) {
  Shard s(4, Shard::kUnbounded);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(push_value(s, i));  // 0-3 ring, 4-9 spill
  EXPECT_EQ(s.size(), 10u);
  EXPECT_EQ(pop_value(s), 0u);
  EXPECT_EQ(pop_value(s), 1u);
  ASSERT_TRUE(push_value(s, 10));
  ASSERT_TRUE(push_value(s, 11));
  for (std::uint64_t i = 2; i < 12; ++i) EXPECT_EQ(pop_value(s), i);
  EXPECT_EQ(pop_value(s), std::nullopt);
  EXPECT_EQ(s.pushed(), 12u);

  Shard bounded(4, 2);  // a ring of 4 and a spill of 2: 6 in all
  for (std::uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(push_value(bounded, i));
  EXPECT_FALSE(push_value(bounded, 6));
  for (std::uint64_t i = 0; i < 6; ++i) EXPECT_EQ(pop_value(bounded), i);
}

// The capacity is split across a power-of-two number of shards (no more
// than the capacity); a push to a full home shard tries the others, so the
// queue holds exactly its capacity.
TEST(TaskQueue, HoldsExactlyItsCapacitySplitAcrossShards) {
  struct Case {
    std::size_t capacity, shards, expected_shards;
  };
  for (const Case k : {Case{10, 4, 4}, Case{5, 3, 2}, Case{1, 8, 1}, Case{7, 16, 4}}) {
    TaskQueue q(k.capacity, k.shards);
    EXPECT_EQ(q.shards(), k.expected_shards) << k.capacity << "/" << k.shards;
    for (std::uint64_t i = 0; i < k.capacity; ++i) ASSERT_TRUE(push_value(q, i));
    EXPECT_FALSE(push_value(q, k.capacity)) << k.capacity << "/" << k.shards;
    EXPECT_EQ(q.size(), k.capacity);
    EXPECT_EQ(q.pushed(), k.capacity);
    std::vector<int> seen(k.capacity, 0);
    while (const std::optional<std::uint64_t> v = pop_value(q)) {
      ASSERT_LT(*v, k.capacity);
      ++seen[*v];
    }
    EXPECT_EQ(seen, std::vector<int>(k.capacity, 1)) << k.capacity << "/" << k.shards;
    EXPECT_TRUE(q.empty());
  }
}

// One producer pushes to its own shard: FIFO for it.
TEST(TaskQueue, OneProducersCellsComeOutInOrder) {
  TaskQueue q(1024, 4);
  for (std::uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(push_value(q, i));
  for (std::uint64_t i = 0; i < 100; ++i) EXPECT_EQ(pop_value(q), i);
  EXPECT_TRUE(q.empty());
}

// The aging rule with aging = 2: a waiting lower level is served after two
// tasks of a higher level, then the higher level again.
TEST(Queues, ALowerLevelIsServedAfterAgingTasksOfAHigherOne) {
  Queues q(64, 1, 3, 2);
  ASSERT_EQ(q.levels(), 3u);
  for (std::uint64_t i = 0; i < 3; ++i) {
    auto fill = carrying(100 + i);
    ASSERT_TRUE(q.try_push(fill, 0));
  }
  for (std::uint64_t i = 0; i < 10; ++i) {
    auto fill = carrying(200 + i);
    ASSERT_TRUE(q.try_push(fill, 2));
  }
  EXPECT_EQ(q.level_size(0), 3u);
  EXPECT_EQ(q.level_size(2), 10u);
  detail::PopState st;
  std::vector<std::uint64_t> order;
  Cell c;
  while (q.try_pop(c, st)) order.push_back(value_of(c));
  EXPECT_EQ(order, (std::vector<std::uint64_t>{200, 201, 100, 202, 203, 101, 204, 205, 102, 206,
                                               207, 208, 209}));
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace crew

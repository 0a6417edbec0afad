// The per-thread cache of small blocks (crew/detail/block_cache.hpp): freed
// task states and boxed callables are reused without the heap, at most 64
// blocks of a size stay per thread, and states aligned beyond the default
// keep their alignment.
#include "crew/detail/block_cache.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "crew/detail/cell.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/pool.hpp"
#include "replaced_new.hpp"  // operator new: counts allocations
#include "test_util.hpp"

namespace crew {
namespace {

constexpr std::size_t kCap = 64;  // blocks of one size a thread keeps

struct Empty {
  void operator()() const {}
};
using SmallState = detail::TaskState<void, Empty>;

// Fills `v` (its room reserved before, so that only states allocate).
void make_states(std::vector<detail::TaskStateBase*>& v, std::size_t n) {
  v.reserve(v.size() + n);
  for (std::size_t i = 0; i < n; ++i) v.push_back(new SmallState(Empty{}));
}

void release_all(const std::vector<detail::TaskStateBase*>& v) {
  for (detail::TaskStateBase* s : v) s->release();
}

// Runs `body` on a new thread, whose cache starts empty.
template <class F>
void on_fresh_thread(F body) {
  std::thread t(body);
  t.join();
}

TEST(BlockCache, AFreedStateIsReusedWithoutTheHeap) {
  if (!detail::kBlockCacheOn)
    GTEST_SKIP() << "off under AddressSanitizer, which must see every free";
  on_fresh_thread([] {
    std::vector<detail::TaskStateBase*> first;
    make_states(first, 10);
    release_all(first);
    std::vector<detail::TaskStateBase*> second;
    second.reserve(10);
    const std::uint64_t before = test::g_allocations.load();
    make_states(second, 10);
    EXPECT_EQ(test::g_allocations.load() - before, 0u);
    // Last freed, first reused.
    for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(second[i], first[9 - i]);
    release_all(second);
  });
}

// A callable too large for a cell is boxed in a cached block: the second
// one of its size on a thread reuses the first one's block.
TEST(BlockCache, ABoxedCallableReusesAFreedBlock) {
  if (!detail::kBlockCacheOn)
    GTEST_SKIP() << "off under AddressSanitizer, which must see every free";
  on_fresh_thread([] {
    std::array<char, 100> payload{};
    int calls = 0;
    auto big = [payload, &calls] { calls += payload[0] + 1; };
    static_assert(!detail::Cell::fits_inline<decltype(big)>);
    detail::Cell first;
    first.emplace(big);
    (void)first.invoke_and_destroy();
    const std::uint64_t before = test::g_allocations.load();
    detail::Cell second;
    second.emplace(big);
    EXPECT_EQ(test::g_allocations.load() - before, 0u);
    (void)second.invoke_and_destroy();
    EXPECT_EQ(calls, 2);
  });
}

// A thread that frees more than 64 blocks of a size returns the rest to
// the heap, also when they were allocated on another thread: no cache grows
// with what moves between threads.
TEST(BlockCache, AThreadKeepsAtMost64BlocksOfASize) {
  if (!detail::kBlockCacheOn)
    GTEST_SKIP() << "off under AddressSanitizer, which must see every free";
  std::vector<detail::TaskStateBase*> made;
  on_fresh_thread([&] { make_states(made, 200); });
  on_fresh_thread([&] {
    release_all(made);
    std::vector<detail::TaskStateBase*> again;
    again.reserve(200);
    const std::uint64_t before = test::g_allocations.load();
    make_states(again, 200);
    EXPECT_EQ(test::g_allocations.load() - before, 200 - kCap);
    release_all(again);
  });
}

struct alignas(128) Aligned {
  std::array<char, 8> bytes{};
};

// An over-aligned result makes an over-aligned state, which must not come
// from the cache's 16-byte-aligned blocks.
TEST(BlockCache, AStateAlignedBeyondTheDefaultKeepsItsAlignment) {
  test::Watchdog dog;
  Pool pool(test::fixed_workers("state-cache", 1));
  for (int i = 0; i < 32; ++i) {
    Task<Aligned> t = pool.submit([] { return Aligned{}; });
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.state()) % alignof(Aligned), 0u);
    (void)t.get();
  }
}

}  // namespace
}  // namespace crew

// The per-thread cache of small blocks (crew/detail/block_cache.hpp): freed
// task states, their Extras and boxed callables are reused without the
// heap, at most 64 blocks of a size stay per thread, blocks freed on
// another thread come back through the bounded depot, and states aligned
// beyond the default keep their alignment, and a process forked while
// another thread uses the depot can use it in the child.
#include "crew/detail/block_cache.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
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

// A thread that frees more than 64 blocks of a size hands them on in
// batches of 32 to the process-wide depot; a thread whose cache is empty
// takes them from there before it asks the heap. So blocks allocated on one
// thread and freed on another come back without the heap.
TEST(BlockCache, BlocksFreedOnAnotherThreadComeBackThroughTheDepot) {
  if (!detail::kBlockCacheOn)
    GTEST_SKIP() << "off under AddressSanitizer, which must see every free";
  // Held until the end: whatever the depot held before, so that it starts
  // empty.
  std::vector<detail::TaskStateBase*> held;
  on_fresh_thread([&] { make_states(held, 2048); });
  std::vector<detail::TaskStateBase*> made;
  on_fresh_thread([&] { make_states(made, 200); });
  // 200 frees: the cache reaches 64 at the 64th, hands 32 on at the 65th
  // and at every 32nd after: 5 batches in the depot, 40 blocks in the
  // cache, which go back to the heap as the thread exits.
  on_fresh_thread([&] { release_all(made); });
  on_fresh_thread([&] {
    std::vector<detail::TaskStateBase*> again;
    again.reserve(160);
    const std::uint64_t before = test::g_allocations.load();
    make_states(again, 160);
    EXPECT_EQ(test::g_allocations.load() - before, 0u);
    // The depot is empty now: the next one comes from the heap.
    std::vector<detail::TaskStateBase*> more;
    more.reserve(1);
    const std::uint64_t before_more = test::g_allocations.load();
    make_states(more, 1);
    EXPECT_EQ(test::g_allocations.load() - before_more, 1u);
    release_all(more);
    release_all(again);
  });
  release_all(held);
}

// The depot is bounded: a thread that frees many blocks that came from
// elsewhere sends what neither its cache nor the depot keeps to the heap.
TEST(BlockCache, TheDepotKeepsAtMost1024BlocksOfASize) {
  if (!detail::kBlockCacheOn)
    GTEST_SKIP() << "off under AddressSanitizer, which must see every free";
  constexpr std::size_t kMade = 3000;
  constexpr std::size_t kDepot = 1024;
  std::vector<detail::TaskStateBase*> made;
  on_fresh_thread([&] { make_states(made, kMade); });
  on_fresh_thread([&] {
    // First empty the depot of what earlier tests left there.
    std::vector<detail::TaskStateBase*> drain;
    make_states(drain, 2 * kDepot);
    release_all(made);
    std::vector<detail::TaskStateBase*> again;
    again.reserve(kMade);
    const std::uint64_t before = test::g_allocations.load();
    make_states(again, kMade);
    const std::uint64_t from_heap = test::g_allocations.load() - before;
    // What came back is at most the cache's 64 and the depot's 1,024.
    EXPECT_GE(from_heap, kMade - kDepot - kCap);
    EXPECT_LT(from_heap, kMade);
    release_all(again);
    for (detail::TaskStateBase* s : drain) s->release();
  });
}

// The depot's locks are process-wide: a fork that copied one held by
// another thread would leave it held in the child, whose only thread then
// spins on it for ever the first time its cache runs dry or overflows. The
// depot takes its locks around fork() (glibc does the same for malloc's
// arenas).
TEST(BlockCache, AChildForkedWhileAnotherThreadUsesTheDepotCanUseItToo) {
  if (!detail::kBlockCacheOn)
    GTEST_SKIP() << "off under AddressSanitizer, which must see every free";
  test::Watchdog dog(std::chrono::seconds(60));
  constexpr std::size_t kSize = 64;
  // Three batches of one size, allocated and freed over and over: the
  // thread's cache runs dry and overflows, so it takes batches from the
  // depot and hands them back, under the size's lock, all the time.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> rounds{0};
  std::thread churn([&] {
    std::vector<void*> blocks(3 * kCap / 2);
    while (!stop.load(std::memory_order_relaxed)) {
      for (void*& b : blocks) b = detail::cached_alloc(kSize);
      for (void* b : blocks) detail::cached_free(b, kSize);
      rounds.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (rounds.load() < 100) std::this_thread::yield();
  constexpr int kForks = 200;
  int hung = 0;
  for (int i = 0; i < kForks && hung == 0; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) {
      // The child's cache starts as this thread's was: empty it, overflow
      // it, and so take from and put to the depot (only _exit after).
      std::vector<void*> blocks(4 * kCap);
      for (void*& b : blocks) b = detail::cached_alloc(kSize);
      for (void* b : blocks) detail::cached_free(b, kSize);
      _exit(0);
    }
    const auto give_up =
        std::chrono::steady_clock::now() + std::chrono::seconds(5 * test::kSlowdown);
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (done == 0) {
      ++hung;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    } else {
      ASSERT_EQ(done, pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << i;
    }
  }
  stop = true;
  churn.join();
  EXPECT_EQ(hung, 0) << "a child hung on a depot lock copied held";
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

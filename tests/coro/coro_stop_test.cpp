// The stop of a coroutine task (crew/detail/coro_stop.hpp): the token
// current_stop_token() hands out, made on the first call, and the tasks
// spawned from it, stopped with it however deep.
#include "crew/detail/coro_stop.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stop_token>
#include <thread>
#include <utility>

#include "crew/coro.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::fixed_workers;
using test::Watchdog;

struct Seen {
  std::atomic<bool> asleep{false};
  std::atomic<bool> callback_ran{false};
  std::atomic<bool> late_token_stopped{false};
  std::atomic<int> ended{0};
};

class CoroStop : public ::testing::Test {
 protected:
  // Spawns `co` and waits until it is about to sleep.
  Task<void> spawn_asleep(Co<void> co) {
    Task<void> t = spawn(pool, std::move(co));
    EXPECT_TRUE(test::eventually([this] { return seen.asleep.load(); }));
    return t;
  }

  Watchdog dog;
  Seen seen;  // outlives the pool and its frames
  Pool pool{fixed_workers("co", 2)};
};

// Asks for its token before sleeping and hangs a callback on it.
Co<void> token_then_sleep(Seen* seen) {
  const auto on_stop = [seen] { seen->callback_ran = true; };
  const std::stop_callback cb(current_stop_token(), on_stop);
  seen->asleep = true;
  co_await sleep_for(60s);
}

TEST_F(CoroStop, ACancelStopsTheTokenHandedOutAndRunsItsCallback) {
  Task<void> t = spawn_asleep(token_then_sleep(&seen));
  EXPECT_EQ(t.cancel(), CancelResult::stop_requested);
  ASSERT_TRUE(t.wait_for(2s * test::kSlowdown));
  EXPECT_EQ(t.status(), TaskStatus::cancelled);
  EXPECT_TRUE(seen.callback_ran.load());
}

// Asks for its token only after the stop ended its sleep: the token is
// made then, and must read stopped.
Co<void> sleep_then_token(Seen* seen) {
  seen->asleep = true;
  try {
    co_await sleep_for(60s);
  } catch (const Error&) {
  }
  seen->late_token_stopped = current_stop_token().stop_requested();
}

TEST_F(CoroStop, ATokenFirstAskedForAfterTheStopReadsStopped) {
  Task<void> t = spawn_asleep(sleep_then_token(&seen));
  (void)t.cancel();
  ASSERT_TRUE(t.wait_for(2s * test::kSlowdown));
  EXPECT_TRUE(seen.late_token_stopped.load());
}

// Each level spawns the next and awaits it; the deepest sleeps.
Co<void> level(Pool& pool, int below, Seen* seen) {
  struct Ended {
    Seen* seen;
    ~Ended() { seen->ended.fetch_add(1); }
  } ended{seen};
  if (below == 0) {
    seen->asleep = true;
    co_await sleep_for(60s);
    co_return;
  }
  Task<void> next = spawn(pool, level(pool, below - 1, seen));
  co_await next;
}

TEST_F(CoroStop, AStopReachesEveryGenerationOfSpawnedTasks) {
  constexpr int kBelow = 20;
  Task<void> root = spawn_asleep(level(pool, kBelow, &seen));
  (void)root.cancel();
  ASSERT_TRUE(root.wait_for(2s * test::kSlowdown));
  EXPECT_EQ(root.status(), TaskStatus::cancelled);
  // Every level's frame is gone: the deepest was stopped through 20
  // parents, not by its 60 s sleep.
  ASSERT_TRUE(pool.wait_idle(2s * test::kSlowdown));
  EXPECT_EQ(seen.ended.load(), kBelow + 1);
}

}  // namespace
}  // namespace crew

// Tests of the process-wide spinning slots (src/engine/wake.cpp): a child
// of fork() starts with every slot free, whatever the parent's spinning
// workers held at the fork.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crew/pool.hpp"
#include "test_util.hpp"
#include "wake_policy.hpp"

namespace crew::detail {
namespace {

// The slots, as the parent's spinning workers would hold them at a fork: in
// the child nobody will give them back, and a child holding them would
// never let its own pools' workers spin (every hand-off then a futex wake).
TEST(SpinnerSlots, AChildOfForkStartsWithEverySlotFree) {
  test::Watchdog dog;
  ASSERT_EQ(spinner_slots_taken(), 0) << "a worker of another test still spins";
  int held = 0;
  while (take_spinner_slot()) ++held;
  ASSERT_GT(held, 0);
  ASSERT_EQ(spinner_slots_taken(), held);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << "fork failed";
  if (child == 0) {
    // In the child: nothing held, and every slot can be taken again.
    int taken = 0;
    const bool free_at_start = spinner_slots_taken() == 0;
    while (take_spinner_slot()) ++taken;
    _exit(free_at_start && taken == held ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  for (int i = 0; i < held; ++i) give_back_spinner_slot();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child inherited the parent's slots";
  EXPECT_EQ(spinner_slots_taken(), 0);
}

// A pool's spinning worker takes a slot and gives it back: once the pool is
// gone every slot is free again.
TEST(SpinnerSlots, APoolsWorkersGiveTheirSlotsBack) {
  test::Watchdog dog;
  {
    Pool pool({.max_workers = 2});
    for (int i = 0; i < 1000; ++i) pool.submit([] {}).get();
  }
  EXPECT_EQ(spinner_slots_taken(), 0);
}

}  // namespace
}  // namespace crew::detail

// Tests of the process-wide spinning slots (src/engine/wake.cpp): how many
// there are, and that a child of fork() starts with every slot free,
// whatever the parent's spinning workers held at the fork.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crew/pool.hpp"
#include "crew/usable_cpus.hpp"
#include "test_util.hpp"
#include "wake_policy.hpp"

namespace crew::detail {
namespace {

// Half the usable CPUs, rounded down: none with one, where a spinner would
// only hold the CPU from the thread that gives it work.
TEST(SpinnerSlots, HalfTheUsableCpusAndNoneWithOne) {
  EXPECT_EQ(spinner_limit_for(1), 0);
  EXPECT_EQ(spinner_limit_for(2), 1);
  EXPECT_EQ(spinner_limit_for(3), 1);
  EXPECT_EQ(spinner_limit_for(4), 2);
  EXPECT_EQ(spinner_limit_for(64), 32);
}

// The process has exactly spinner_limit_for(usable_cpus()) slots.
TEST(SpinnerSlots, TheProcessHasTheSlotsItsUsableCpusGive) {
  test::Watchdog dog;
  ASSERT_EQ(spinner_slots_taken(), 0) << "a worker of another test still spins";
  int held = 0;
  while (take_spinner_slot()) ++held;
  EXPECT_EQ(held, spinner_limit_for(usable_cpus()));
  for (int i = 0; i < held; ++i) give_back_spinner_slot();
  EXPECT_EQ(spinner_slots_taken(), 0);
}

// The slots, as the parent's spinning workers would hold them at a fork: in
// the child nobody will give them back, and a child holding them would
// never let its own pools' workers spin (every hand-off then a futex wake).
TEST(SpinnerSlots, AChildOfForkStartsWithEverySlotFree) {
  if (usable_cpus() < 2) GTEST_SKIP() << "one usable CPU: no slot the parent could hold";
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

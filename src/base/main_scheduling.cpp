// src/base/main_scheduling.cpp: see main_scheduling.hpp.
#include "main_scheduling.hpp"

#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#endif

namespace crew::detail {

#if defined(__linux__)
namespace {

// struct sched_attr of <linux/sched/types.h>, which glibc 2.36 does not
// declare: its first version (SCHED_ATTR_SIZE_VER0), up to sched_period.
struct SchedAttr {
  std::uint32_t size;
  std::uint32_t sched_policy;
  std::uint64_t sched_flags;
  std::int32_t sched_nice;
  std::uint32_t sched_priority;
  std::uint64_t sched_runtime;
  std::uint64_t sched_deadline;
  std::uint64_t sched_period;
};

bool get_attr(pid_t tid, SchedAttr& a) noexcept {
  a = SchedAttr{};
  a.size = sizeof a;
  return ::syscall(SYS_sched_getattr, tid, &a, static_cast<unsigned>(sizeof a), 0U) == 0;
}

bool set_attr(SchedAttr a) noexcept {
  a.size = sizeof a;
  a.sched_flags = 0;
  a.sched_deadline = 0;
  a.sched_period = 0;
  return ::syscall(SYS_sched_setattr, 0, &a, 0U) == 0;
}

}  // namespace

void adopt_main_thread_scheduling() noexcept {
  SchedAttr main_attr{};
  SchedAttr own{};
  if (!get_attr(::getpid(), main_attr) || !get_attr(0, own)) return;
  if (main_attr.sched_policy != SCHED_OTHER && main_attr.sched_policy != SCHED_BATCH &&
      main_attr.sched_policy != SCHED_IDLE) {
    return;
  }
  // A slice of 0 asks for the system's; under SCHED_IDLE the kernel keeps
  // the nice value but ignores it.
  SchedAttr want = main_attr;
  want.sched_priority = 0;
  if (set_attr(want)) return;
  // Refused (EPERM): no right to a lower nice value, nor, without one, to
  // leave SCHED_IDLE. Then as much of it as is allowed.
  want.sched_nice = own.sched_nice;
  if (set_attr(want)) return;
  want.sched_policy = own.sched_policy;
  (void)set_attr(want);
}
#else
void adopt_main_thread_scheduling() noexcept {}
#endif

}  // namespace crew::detail

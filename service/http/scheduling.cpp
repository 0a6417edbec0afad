// service/http/scheduling.cpp: see scheduling.hpp.
#include "http/scheduling.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace crewd {

std::string set_time_slice(std::chrono::microseconds slice) {
  const int policy = ::sched_getscheduler(0);
  if (policy != SCHED_OTHER && policy != SCHED_BATCH && policy != SCHED_IDLE)
    return "the thread is not under SCHED_OTHER, SCHED_BATCH or SCHED_IDLE";
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, 0);  // the calling thread's on Linux
  if (errno != 0) return std::strerror(errno);
  // struct sched_attr of <linux/sched/types.h>, which glibc 2.36 does not
  // declare: its first version (SCHED_ATTR_SIZE_VER0), up to sched_period.
  struct {
    std::uint32_t size;
    std::uint32_t sched_policy;
    std::uint64_t sched_flags;
    std::int32_t sched_nice;
    std::uint32_t sched_priority;
    std::uint64_t sched_runtime;
    std::uint64_t sched_deadline;
    std::uint64_t sched_period;
  } attr{};
  attr.size = sizeof attr;
  attr.sched_policy = static_cast<std::uint32_t>(policy);
  attr.sched_nice = nice;
  attr.sched_runtime = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count());
  if (::syscall(SYS_sched_setattr, 0, &attr, 0) != 0) return std::strerror(errno);
  return {};
}

std::string set_real_time(int priority) {
  sched_param param{};
  param.sched_priority = priority;
  if (::sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &param) != 0) {
    const int error = errno;
    std::string why = std::strerror(error);
    if (error == EPERM)
      why += " (needs CAP_SYS_NICE or an RLIMIT_RTPRIO of " + std::to_string(priority) + ")";
    return why;
  }
  return {};
}

}  // namespace crewd

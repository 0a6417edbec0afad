#include "crew/detail/futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace crew::detail {
namespace {

long futex(const std::atomic<std::uint32_t>& word, int op, std::uint32_t val,
           const struct timespec* ts, unsigned bitset) noexcept {
  // std::atomic<uint32_t> is layout-compatible with uint32_t on Linux targets.
  return syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), op, val, ts, nullptr,
                 static_cast<std::uint32_t>(bitset));
}

}  // namespace

void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::steady_clock::time_point deadline) noexcept {
  if (deadline == kNoDeadline) {
    futex_wait(word, expected);
    return;
  }
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time, which is what
  // steady_clock reads on Linux.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch());
  struct timespec ts {};
  ts.tv_sec = static_cast<time_t>(ns.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(ns.count() % 1'000'000'000);
  futex(word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected, &ts,
        static_cast<unsigned>(FUTEX_BITSET_MATCH_ANY));
}

void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  futex(word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected, nullptr,
        static_cast<unsigned>(FUTEX_BITSET_MATCH_ANY));
}

void futex_wake(const std::atomic<std::uint32_t>& word, int count) noexcept {
  futex(word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, static_cast<std::uint32_t>(count), nullptr, 0);
}

}  // namespace crew::detail

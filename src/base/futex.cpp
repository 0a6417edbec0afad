#include "futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <climits>

namespace crew::detail {
namespace {

// std::atomic<uint32_t> and <uint64_t> are layout-compatible with the plain
// integers on Linux targets; the low half of a 64-bit word is its first
// four bytes on little-endian ones.
static_assert(std::endian::native == std::endian::little, "futex_*_low assume little-endian");

const std::uint32_t* address(const std::atomic<std::uint32_t>& word) noexcept {
  return reinterpret_cast<const std::uint32_t*>(&word);
}
const std::uint32_t* address(const std::atomic<std::uint64_t>& word) noexcept {
  return reinterpret_cast<const std::uint32_t*>(&word);
}

long futex(const std::uint32_t* word, int op, std::uint32_t val, const struct timespec* ts,
           unsigned bitset) noexcept {
  return syscall(SYS_futex, word, op, val, ts, nullptr, static_cast<std::uint32_t>(bitset));
}

void wait(const std::uint32_t* word, std::uint32_t expected,
          std::chrono::steady_clock::time_point deadline) noexcept {
  if (deadline == kNoDeadline) {
    futex(word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected, nullptr,
          static_cast<unsigned>(FUTEX_BITSET_MATCH_ANY));
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

void wake(const std::uint32_t* word, int count) noexcept {
  futex(word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, static_cast<std::uint32_t>(count), nullptr, 0);
}

}  // namespace

void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::steady_clock::time_point deadline) noexcept {
  wait(address(word), expected, deadline);
}

void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  wait(address(word), expected, kNoDeadline);
}

void futex_wake(const std::atomic<std::uint32_t>& word, int count) noexcept {
  wake(address(word), count);
}

void futex_wait_low(const std::atomic<std::uint64_t>& word, std::uint32_t expected,
                    std::chrono::steady_clock::time_point deadline) noexcept {
  wait(address(word), expected, deadline);
}

void futex_wake_low(const std::atomic<std::uint64_t>& word, int count) noexcept {
  wake(address(word), count);
}

}  // namespace crew::detail

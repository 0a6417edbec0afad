// src/base/futex.hpp (private): waiting on a 32-bit atomic with a deadline.
// std::atomic::wait has no timed form, so crew uses the Linux futex directly.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace crew::detail {

// Blocks while `*word == expected`, until woken or `deadline` (steady clock)
// passes. Spurious returns are possible; callers re-check their condition.
void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::steady_clock::time_point deadline) noexcept;
void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept;
void futex_wake(const std::atomic<std::uint32_t>& word, int count) noexcept;

// The same on the low 32 bits of a 64-bit atomic, for a word that shares
// its read-modify-writes with 32 other bits (task_state.hpp). Changes to the
// high half neither wake a waiter nor make its wait return.
void futex_wait_low(const std::atomic<std::uint64_t>& word, std::uint32_t expected,
                    std::chrono::steady_clock::time_point deadline) noexcept;
void futex_wake_low(const std::atomic<std::uint64_t>& word, int count) noexcept;

// A deadline that never passes.
inline constexpr auto kNoDeadline = std::chrono::steady_clock::time_point::max();

}  // namespace crew::detail

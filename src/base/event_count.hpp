// src/base/event_count.hpp (private): lets a thread sleep until a condition it
// polls becomes true, without a lost wake-up and without a syscall on the
// notify side when nobody sleeps.
//
//   waiter:   auto key = ec.prepare_wait();
//             if (condition()) { ec.cancel_wait(); return; }
//             ec.wait(key, deadline);
//   notifier: make condition() true; ec.notify_one();
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "futex.hpp"

namespace crew::detail {

class EventCount {
 public:
  using Key = std::uint32_t;

  EventCount() noexcept = default;
  EventCount(const EventCount&) = delete;
  EventCount& operator=(const EventCount&) = delete;

  [[nodiscard]] Key prepare_wait() noexcept {
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    return epoch_.load(std::memory_order_seq_cst);
  }
  void cancel_wait() noexcept { waiters_.fetch_sub(1, std::memory_order_seq_cst); }

  // Returns false when the deadline passed without a notification.
  bool wait(Key key, std::chrono::steady_clock::time_point deadline = kNoDeadline) noexcept {
    bool notified = true;
    while (epoch_.load(std::memory_order_acquire) == key) {
      if (deadline != kNoDeadline && std::chrono::steady_clock::now() >= deadline) {
        notified = false;
        break;
      }
      futex_wait(epoch_, key, deadline);
    }
    waiters_.fetch_sub(1, std::memory_order_seq_cst);
    return notified;
  }

  // Cheap when nobody waits: one uncontended read-modify-write.
  void notify_one() noexcept { notify(1); }
  void notify_all() noexcept { notify(INT32_MAX); }

  [[nodiscard]] std::uint32_t waiters() const noexcept {
    return waiters_.load(std::memory_order_seq_cst);
  }

  // For callers that already ordered their condition update before this call
  // with a seq_cst operation: wakes one waiter, skipping the fence.
  void wake_one() noexcept {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(epoch_, 1);
  }

 private:
  void notify(int count) noexcept {
    // A seq_cst read-modify-write orders the caller's condition update before
    // the read of waiters_ (a fence would too, but ThreadSanitizer does not
    // model fences).
    if (waiters_.fetch_add(0, std::memory_order_seq_cst) == 0) return;
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(epoch_, count);
  }

  alignas(64) std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> waiters_{0};
};

}  // namespace crew::detail

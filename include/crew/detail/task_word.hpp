// crew/detail/task_word.hpp: detail::TaskWord, the status word and the
// reference count of a task's shared state (TaskStateBase derives from
// it): the claim and settle steps that make every task end in exactly one
// outcome, and the waits for it. It owns no memory and calls nothing of
// the task: the steps that delete the state (release, finish_and_release)
// or call its callable's hooks (leave_queue, expire, shed) are
// TaskStateBase's (task_state.hpp); the waits are in src/engine/task.cpp.
//
// Ownership: reference counted. The queue cell holds one reference until the
// task is popped and settled; each Task handle holds one; the pool's timer
// heap holds one while a queue deadline is armed.
//
// One 64-bit atomic holds both the status and the count, so that a runner
// can publish the outcome and drop the queue's reference in one
// read-modify-write (finish_and_release):
//   bits 0-31   the status word, futex-waitable (the low half on the
//               little-endian targets crew builds for): bits 0-7
//               TaskStatus, bits 8-15 the Errc of a non-success outcome,
//               bit 28 "an outcome decided in the queue is being settled"
//               (it still reads as queued), bit 29 "written off: its
//               callable still runs", bit 30 "it went through running",
//               bit 31 "someone waits"
//   bits 32-63  the reference count
// The status leaves `queued` by exactly one compare-exchange (to running,
// cancelled or rejected) and leaves `running` by exactly one
// compare-exchange to its outcome: that is what makes every task end in
// exactly one outcome, even when a worker and the supervisor race.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "crew/detail/assert.hpp"
#include "crew/error.hpp"
#include "crew/task_status.hpp"

namespace crew::detail {

// Who touches what: any thread holding a reference, through the word's
// read-modify-writes; waiters park on its low half (a futex).
class TaskWord {
 public:
  static constexpr std::uint32_t kStatusMask = 0xffu;
  // Set with an outcome decided while queued until it is counted and the
  // callable destroyed (settle_in_queue): the task still reads as queued.
  static constexpr std::uint32_t kSettlingBit = 1u << 28;
  static constexpr std::uint32_t kLiveBit = 1u << 29;
  static constexpr std::uint32_t kRanBit = 1u << 30;
  static constexpr std::uint32_t kWaitersBit = 1u << 31;

  TaskWord(const TaskWord&) = delete;
  TaskWord& operator=(const TaskWord&) = delete;

  void add_ref() noexcept { word_.fetch_add(kOneRef, std::memory_order_relaxed); }
  // Before the state is shared with another thread: one more reference
  // without a locked instruction.
  void add_ref_unshared() noexcept {
    word_.store(word_.load(std::memory_order_relaxed) + kOneRef, std::memory_order_relaxed);
  }

  [[nodiscard]] TaskStatus status() const noexcept {
    return status_of(static_cast<std::uint32_t>(word_.load(std::memory_order_acquire)));
  }
  // The status byte as it is: the outcome claim_in_queue decided, while it
  // is being settled, too.
  [[nodiscard]] TaskStatus raw_status() const noexcept {
    return static_cast<TaskStatus>(word_.load(std::memory_order_acquire) & kStatusMask);
  }
  // The status a status word shows (queued while an outcome decided in the
  // queue is being settled).
  [[nodiscard]] static TaskStatus status_of(std::uint32_t w) noexcept {
    return (w & kSettlingBit) != 0 ? TaskStatus::queued : static_cast<TaskStatus>(w & kStatusMask);
  }
  [[nodiscard]] Errc reason() const noexcept {
    return static_cast<Errc>((word_.load(std::memory_order_acquire) >> 8) & 0xffu);
  }
  [[nodiscard]] bool done() const noexcept { return is_final(status()); }
  // True once the task left `queued` for `running` (it ran, or runs now).
  [[nodiscard]] bool ran() const noexcept {
    return (word_.load(std::memory_order_acquire) & kRanBit) != 0;
  }

  // The first step of leave_queue to an outcome: decides it, unseen
  // (kSettlingBit). The caller then calls settle_in_queue().
  bool claim_in_queue(TaskStatus to, Errc why) noexcept {
    CREW_ASSERT(is_final(to), "claim_in_queue to a status that is not an outcome");
    std::uint64_t cur = word_.load(std::memory_order_relaxed);
    for (;;) {
      if ((cur & kStatusMask) != static_cast<std::uint32_t>(TaskStatus::queued)) return false;
      CREW_ASSERT(is_legal_transition(TaskStatus::queued, to), "illegal task transition");
      const std::uint64_t next = (cur & (kRefMask | kWaitersBit)) | encode(to, why) | kSettlingBit;
      if (word_.compare_exchange_weak(cur, next, std::memory_order_acq_rel)) return true;
    }
  }
  // The last step: publishes the outcome and wakes the waiters.
  void publish_settled() noexcept {
    wake(word_.fetch_and(~std::uint64_t{kSettlingBit}, std::memory_order_acq_rel));
  }

  // running -> outcome. False if the outcome was already decided (the task
  // was abandoned while it ran).
  bool finish(TaskStatus outcome, Errc why = Errc{}) noexcept {
    return leave_running(kRanBit | encode(outcome, why));
  }
  // running -> outcome for a run the pool writes off while its callable
  // still runs (it ignored its stop for abandon_grace): the outcome is
  // decided now, and callable_live() stays true until the running thread
  // calls callable_returned(). False as finish().
  bool finish_written_off(TaskStatus outcome) noexcept {
    return leave_running(kRanBit | kLiveBit | encode(outcome, Errc::abandoned));
  }
  // Called by the thread that ran a written-off callable, once it returned.
  void callable_returned() noexcept {
    wake(word_.fetch_and(~std::uint64_t{kLiveBit}, std::memory_order_acq_rel));
  }
  // True while a written-off callable still runs.
  [[nodiscard]] bool callable_live() const noexcept {
    return (word_.load(std::memory_order_acquire) & kLiveBit) != 0;
  }

  // Blocks until the task has an outcome or the deadline passes.
  bool wait_until(std::chrono::steady_clock::time_point deadline) const noexcept;
  // Blocks until the task has an outcome and its callable returned (see
  // finish_written_off), or the deadline passes.
  bool wait_returned_until(std::chrono::steady_clock::time_point deadline) const noexcept;
  static constexpr int kSpinPolls = 16;

 protected:
  TaskWord() noexcept = default;
  ~TaskWord() = default;

  static constexpr std::uint32_t encode(TaskStatus s, Errc why) noexcept {
    return static_cast<std::uint32_t>(s) | (static_cast<std::uint32_t>(why) << 8);
  }
  static constexpr std::uint64_t kOneRef = std::uint64_t{1} << 32;
  static constexpr std::uint64_t kRefMask = ~std::uint64_t{0} << 32;
  static constexpr std::uint32_t refs(std::uint64_t word) noexcept {
    return static_cast<std::uint32_t>(word >> 32);
  }
  // Wakes the word's waiters if `prev` (its value before the change) says
  // there are any.
  void wake(std::uint64_t prev) noexcept;
  // The one compare-exchange out of `running`, to the status word `next`
  // (the waiters bit is not kept: the waiters are woken).
  bool leave_running(std::uint32_t next) noexcept {
    CREW_ASSERT(
        is_legal_transition(TaskStatus::running, static_cast<TaskStatus>(next & kStatusMask)),
        "illegal task transition");
    std::uint64_t cur = word_.load(std::memory_order_relaxed);
    for (;;) {
      if ((cur & kStatusMask) != static_cast<std::uint32_t>(TaskStatus::running)) return false;
      if (word_.compare_exchange_weak(cur, (cur & kRefMask) | next, std::memory_order_acq_rel)) {
        wake(cur);
        return true;
      }
    }
  }
  // Parks on the word until `settled(word)` or the deadline passes.
  template <class Settled>
  bool park_until(Settled settled, std::chrono::steady_clock::time_point deadline) const noexcept;

  // The status word and the reference count (top of file); one reference
  // (the creator's), queued.
  mutable std::atomic<std::uint64_t> word_{kOneRef |
                                           static_cast<std::uint32_t>(TaskStatus::queued)};
};

}  // namespace crew::detail

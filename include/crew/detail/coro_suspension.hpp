// crew/detail/coro_suspension.hpp: the one suspension a coroutine task may
// be in (crew/detail/coro_task.hpp), and the list of the tasks waiting for
// one to end.
//
// A suspension is armed by the task's own thread (the frame to resume, a
// new generation number) and claimed once by whoever wakes it first (the
// event it waits for, or the task's stop): one compare-exchange on the
// generation word. A claimed suspension is not armed, so nobody else can
// resume or destroy the frame; the claimer queues the resumption (or
// resumes it at once, on the thread that ended the awaited task).
#pragma once

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <utility>

#include "crew/detail/clock.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

class CoroTaskBase;

// Why a suspended task was resumed.
enum class Wake : std::uint8_t { none, event, stop };
// What a suspended task waits for (the snapshot's `waits_on`).
enum class WaitKind : std::uint8_t { none, sleep, task, yield, callback };
[[nodiscard]] const char* to_string(WaitKind k) noexcept;

class Suspension {
 public:
  Suspension() noexcept = default;
  Suspension(const Suspension&) = delete;
  Suspension& operator=(const Suspension&) = delete;

  // The task's thread, inside await_suspend: arms the next generation for
  // frame `h` and returns it. `stoppable` false: a stop does not end it.
  std::uint64_t arm(std::coroutine_handle<> h, WaitKind kind, bool stoppable) noexcept {
    resume_at_ = h;
    waiting_on_.store(kind, std::memory_order_relaxed);
    since_ns_.store(now_ns(), std::memory_order_relaxed);
    stoppable_.store(stoppable, std::memory_order_relaxed);  // published by the store below
    woke_ = Wake::none;
    const std::uint64_t gen = ++gen_;
    word_.store((gen << 1) | 1, std::memory_order_seq_cst);
    return gen;
  }
  // Any thread: takes generation `gen`, recording why; false if it was
  // claimed already (or re-armed since).
  bool claim(std::uint64_t gen, Wake why) noexcept {
    std::uint64_t expected = (gen << 1) | 1;
    if (!word_.compare_exchange_strong(expected, gen << 1, std::memory_order_acq_rel)) return false;
    woke_ = why;  // read by the resumed frame, after the claimer queued it
    return true;
  }
  // The current generation if armed, else 0.
  [[nodiscard]] std::uint64_t armed_gen() const noexcept {
    const std::uint64_t w = word_.load(std::memory_order_seq_cst);
    return (w & 1) != 0 ? w >> 1 : 0;
  }
  [[nodiscard]] bool stoppable() const noexcept {
    return stoppable_.load(std::memory_order_relaxed);
  }
  // The frame a claim resumes (the claimer, or the task's thread).
  [[nodiscard]] std::coroutine_handle<> frame() const noexcept { return resume_at_; }
  void clear_frame() noexcept { resume_at_ = nullptr; }
  // A co_await that does not suspend: why it ends (the task's thread).
  void set_wake(Wake why) noexcept { woke_ = why; }
  // In await_resume: why it ended, and reset.
  Wake take_wake() noexcept { return std::exchange(woke_, Wake::none); }

  // For the snapshot, from any thread (approximate while it changes).
  [[nodiscard]] WaitKind waits_on() const noexcept {
    return waiting_on_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::int64_t since_ns() const noexcept {
    return since_ns_.load(std::memory_order_relaxed);
  }

 private:
  // Bit 0: armed; the rest: the generation.
  std::atomic<std::uint64_t> word_{0};
  std::uint64_t gen_ = 0;              // the task's thread only
  std::coroutine_handle<> resume_at_;  // written before arming
  Wake woke_ = Wake::none;             // written by the claimer, or the task's thread
  std::atomic<WaitKind> waiting_on_{WaitKind::none};
  std::atomic<std::int64_t> since_ns_{0};
  std::atomic<bool> stoppable_{true};
};

// One coroutine task waiting for another one to end: a node kept in the
// waiting task (it waits for one thing at a time), in the target's list.
struct WaitNode {
  CoroTaskBase* waiter = nullptr;
  std::uint64_t gen = 0;
  CoroTaskBase* target = nullptr;  // whose list it is in (its handle keeps it alive)
  WaitNode* next = nullptr;
};

// The tasks waiting for one task to end, closed when it ends. Any thread;
// a spin lock (a few instructions per section).
class WaitList {
 public:
  WaitList() noexcept = default;
  WaitList(const WaitList&) = delete;
  WaitList& operator=(const WaitList&) = delete;

  // Adds `n` unless the list is closed (the task ended); false then.
  bool add(WaitNode* n) noexcept {
    SpinLockGuard lock(mu_);
    if (closed_) return false;
    n->next = head_;
    head_ = n;
    return true;
  }
  // Takes `n` out if it is still in (the list was not closed since).
  void remove(WaitNode* n) noexcept {
    SpinLockGuard lock(mu_);
    for (WaitNode** p = &head_; *p != nullptr; p = &(*p)->next) {
      if (*p == n) {
        *p = n->next;
        return;
      }
    }
  }
  // Closes the list and returns the nodes `claim` took (it runs under the
  // lock: a claimed waiter's node stays as it is until its claimer let go).
  template <class Claim>
  WaitNode* close(Claim claim) noexcept {
    WaitNode* claimed = nullptr;
    SpinLockGuard lock(mu_);
    closed_ = true;
    WaitNode* list = std::exchange(head_, nullptr);
    while (list != nullptr) {
      WaitNode* n = std::exchange(list, list->next);
      if (claim(*n)) {
        n->next = claimed;
        claimed = n;
      }
    }
    return claimed;
  }

 private:
  SpinLock mu_;
  WaitNode* head_ CREW_GUARDED_BY(mu_) = nullptr;
  bool closed_ CREW_GUARDED_BY(mu_) = false;
};

}  // namespace crew::detail

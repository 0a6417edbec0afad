// crew/detail/coro_suspension.hpp: the one suspension a coroutine task may
// be in (crew/detail/coro_task.hpp), and the list of the tasks waiting for
// one to end.
//
// A suspension is armed by the task's own thread (the frame to resume, a
// new generation number) and claimed once by whoever wakes it first (the
// event it waits for, or the task's stop): one compare-exchange on the
// generation word, which also records why it woke. A claimed suspension is
// not armed, so nobody else can resume or destroy the frame.
//
// Between arm() and settle() the arming thread is still inside
// await_suspend and reads the task (its stop flag); a claim then does not
// resume the frame but leaves it to that thread, whose settle() fails and
// which goes on without suspending. So no other thread resumes (and may
// end and free) the frame while its own thread still touches it. After a
// successful settle() the claimer queues the resumption (or resumes it at
// once, on the thread that ended the awaited task).
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

// What a claim did.
enum class Claimed : std::uint8_t {
  no,        // claimed already, or re-armed since: not this claimer's
  resume,    // the claimer resumes the frame (queues its step)
  settling,  // the arming thread goes on with it (its settle() fails)
};

class Suspension {
 public:
  Suspension() noexcept = default;
  Suspension(const Suspension&) = delete;
  Suspension& operator=(const Suspension&) = delete;

  // The task's thread, inside await_suspend: arms the next generation for
  // frame `h` and returns it; the suspension is settling until settle().
  // `stoppable` false: a stop does not end it.
  std::uint64_t arm(std::coroutine_handle<> h, WaitKind kind, bool stoppable) noexcept {
    resume_at_ = h;
    waiting_on_.store(kind, std::memory_order_relaxed);
    since_ns_.store(coarse_now_ns(), std::memory_order_relaxed);  // reported only
    stoppable_.store(stoppable, std::memory_order_relaxed);       // published by the store below
    const std::uint64_t gen = ++gen_;
    // Release, not seq_cst: a stop's Dekker pair is the fence between this
    // and the task's read of its stop (CoroTaskBase::finish_arming), and
    // every waker finds the generation through a lock or a read-modify-
    // write that comes after this store.
    word_.store((gen << kGenShift) | kArmed | kSettling, std::memory_order_release);
    return gen;
  }
  // The task's thread, last in await_suspend: true if the task is now
  // suspended (the thread must not touch the task again), false if a claim
  // came while it was settling (go on without suspending; take_wake says
  // why).
  bool settle(std::uint64_t gen) noexcept {
    std::uint64_t expected = (gen << kGenShift) | kArmed | kSettling;
    return word_.compare_exchange_strong(expected, (gen << kGenShift) | kArmed,
                                         std::memory_order_acq_rel, std::memory_order_acquire);
  }
  // Any thread (the task's own too): takes generation `gen`, recording why.
  Claimed claim(std::uint64_t gen, Wake why) noexcept {
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    while ((w >> kGenShift) == gen && (w & kArmed) != 0) {
      const std::uint64_t taken =
          (gen << kGenShift) | (std::uint64_t{static_cast<std::uint8_t>(why)} << kWakeShift);
      if (word_.compare_exchange_weak(w, taken, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
        return (w & kSettling) != 0 ? Claimed::settling : Claimed::resume;
      }
    }
    return Claimed::no;
  }
  // The current generation if armed (settling or not), else 0.
  [[nodiscard]] std::uint64_t armed_gen() const noexcept {
    const std::uint64_t w = word_.load(std::memory_order_seq_cst);
    return (w & kArmed) != 0 ? w >> kGenShift : 0;
  }
  [[nodiscard]] bool stoppable() const noexcept {
    return stoppable_.load(std::memory_order_relaxed);
  }
  // The frame a claim resumes (the claimer, or the task's thread).
  [[nodiscard]] std::coroutine_handle<> frame() const noexcept { return resume_at_; }
  void clear_frame() noexcept { resume_at_ = nullptr; }
  // A co_await that does not suspend: why it ends (the task's thread, not
  // armed: nobody else writes the word then).
  void set_wake(Wake why) noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed) & ~kWakeMask;
    word_.store(w | (std::uint64_t{static_cast<std::uint8_t>(why)} << kWakeShift),
                std::memory_order_relaxed);
  }
  // In await_resume (the task's thread, not armed): why it ended, and reset.
  Wake take_wake() noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    word_.store(w & ~kWakeMask, std::memory_order_relaxed);
    return static_cast<Wake>((w & kWakeMask) >> kWakeShift);
  }

  // For the snapshot, from any thread (approximate while it changes).
  [[nodiscard]] WaitKind waits_on() const noexcept {
    return waiting_on_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::int64_t since_ns() const noexcept {
    return since_ns_.load(std::memory_order_relaxed);
  }

 private:
  // The word: bit 0 armed, bit 1 settling, bits 2-3 the Wake of the last
  // claim (or set_wake), the rest the generation.
  static constexpr std::uint64_t kArmed = 1;
  static constexpr std::uint64_t kSettling = 2;
  static constexpr int kWakeShift = 2;
  static constexpr std::uint64_t kWakeMask = 3U << kWakeShift;
  static constexpr int kGenShift = 4;

  std::atomic<std::uint64_t> word_{0};
  std::uint64_t gen_ = 0;              // the task's thread only
  std::coroutine_handle<> resume_at_;  // written before arming
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

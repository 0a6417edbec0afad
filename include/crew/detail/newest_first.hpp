// crew/detail/newest_first.hpp: detail::NewestFirst, one priority level's
// queue of admitted tasks while the overload controller reports a standing
// queue (crew/overload.hpp: newest first). A bounded double-ended queue of
// cells under a spin lock: the queue for the time a pool cannot keep up,
// when the lock's cost is small next to the wait it saves. Consumers take
// the newest cell (the task that still has time to meet its deadline)
// most of the time, and the oldest now and then (Queues::pop_level), so
// that the bottom of a stack that never empties is not stuck there until
// its queue deadline: it comes up, and CoDel sheds it at its start if it
// waited too long.
//
// Who touches what:
//   submitters from outside the pool, while the controller says standing:
//     try_push (the slot past the newest)
//   consumers (workers, helping waits, shutdown sweeps) and submitters
//     that displace a lower priority's task: try_pop (the newest);
//     consumers: try_pop_oldest (the oldest)
//   anyone: size() and pushed() (racy snapshots)
// The slots are allocated at the first push, so that a pool that is never
// overloaded pays nothing for them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "crew/detail/cell.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

class NewestFirst {
 public:
  explicit NewestFirst(std::size_t capacity) noexcept : cap_(capacity) {}
  NewestFirst(const NewestFirst&) = delete;
  NewestFirst& operator=(const NewestFirst&) = delete;

  // Fills the slot above the top; false when full (or out of memory for
  // the slots): the caller queues the cell elsewhere.
  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    const SpinLockGuard guard(lock_);
    if (count_ == cap_) return false;
    if (slots_ == nullptr) {
      slots_.reset(new (std::nothrow) Cell[cap_]);
      if (slots_ == nullptr) return false;
    }
    fill(slots_[slot(count_)]);
    ++count_;
    // seq_cst, as a ring's claim: a worker that announced its sleep and
    // then finds the queue empty is one this push's wake-up sees
    // (PoolCore::after_push).
    size_.store(count_, std::memory_order_seq_cst);
    pushed_.store(pushed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return true;
  }

  // Moves the newest cell into `out` (empty).
  bool try_pop(Cell& out) noexcept {
    if (size_.load(std::memory_order_acquire) == 0) return false;
    const SpinLockGuard guard(lock_);
    if (count_ == 0) return false;
    --count_;
    slots_[slot(count_)].relocate_to(out);
    size_.store(count_, std::memory_order_release);
    return true;
  }

  // Moves the oldest cell into `out` (empty).
  bool try_pop_oldest(Cell& out) noexcept {
    if (size_.load(std::memory_order_acquire) == 0) return false;
    const SpinLockGuard guard(lock_);
    if (count_ == 0) return false;
    slots_[oldest_].relocate_to(out);
    oldest_ = oldest_ + 1 == cap_ ? 0 : oldest_ + 1;
    --count_;
    size_.store(count_, std::memory_order_release);
    return true;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_.load(std::memory_order_seq_cst); }
  // Cells ever pushed (part of the pool's submitted count).
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return pushed_.load(std::memory_order_relaxed);
  }

 private:
  // The slot of the i-th cell from the oldest (i <= count_ < cap_).
  [[nodiscard]] std::size_t slot(std::size_t i) const CREW_REQUIRES(lock_) {
    const std::size_t at = oldest_ + i;
    return at >= cap_ ? at - cap_ : at;
  }

  const std::size_t cap_;
  SpinLock lock_;
  std::unique_ptr<Cell[]> slots_ CREW_GUARDED_BY(lock_);
  std::size_t oldest_ CREW_GUARDED_BY(lock_) = 0;  // the oldest cell's slot
  std::size_t count_ CREW_GUARDED_BY(lock_) = 0;
  std::atomic<std::size_t> size_{0};      // count_, for lock-free looks
  std::atomic<std::uint64_t> pushed_{0};  // written under lock_
};

}  // namespace crew::detail

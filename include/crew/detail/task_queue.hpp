// crew/detail/task_queue.hpp: the pool's queue of cells.
//
// A bounded multi-producer multi-consumer ring (Vyukov style, with per-slot
// turn numbers so zero-initialised memory is a valid empty ring and pages are
// touched only when used), plus, for capacities above kMaxRing or unbounded
// queues, a locked spill deque behind it. While the spill is non-empty new
// cells go to the spill too, so order stays FIFO.
//
// A slot is one cache line: 8-byte turn + 56-byte cell. A consumer moves the
// cell out before running it, so a slow task never holds a slot.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <new>

#include "crew/detail/cell.hpp"
#include "crew/detail/mutex.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

inline constexpr std::size_t kCacheLine = 64;

class Ring {
 public:
  explicit Ring(std::size_t capacity) : cap_(capacity) {
    if ((cap_ & (cap_ - 1)) == 0) {
      mask_ = cap_ - 1;
      shift_ = static_cast<unsigned>(__builtin_ctzll(cap_));
    }
    // calloc: all turns start at 0 (= free for lap 0), cells empty.
    slots_ = static_cast<Slot*>(std::calloc(cap_, sizeof(Slot)));
    if (slots_ == nullptr) throw std::bad_alloc();
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() { std::free(slots_); }  // the owner drains it first

  // Calls fill(Cell&) on a claimed slot. fill must not throw.
  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      auto [idx, lap] = split(pos);
      Slot& s = slots_[idx];
      const std::uint64_t turn = s.turn.load(std::memory_order_acquire);
      if (turn == 2 * lap) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          fill(s.cell);
          // seq_cst: the submitter's next load (sleeping workers, pool state)
          // must not be ordered before this publication.
          s.turn.store(2 * lap + 1, std::memory_order_seq_cst);
          return true;
        }
      } else if (turn < 2 * lap) {
        return false;  // the consumer of the previous lap has not taken it: full
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  bool try_pop(Cell& out) noexcept {
    std::uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      auto [idx, lap] = split(pos);
      Slot& s = slots_[idx];
      const std::uint64_t turn = s.turn.load(std::memory_order_acquire);
      if (turn == 2 * lap + 1) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          s.cell.relocate_to(out);
          // seq_cst: pairs with a blocked submitter's re-check (see Core).
          s.turn.store(2 * lap + 2, std::memory_order_seq_cst);
          return true;
        }
      } else if (turn < 2 * lap + 1) {
        return false;  // empty (or a producer is still writing this slot)
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  [[nodiscard]] std::size_t size() const noexcept {
    const std::uint64_t h = head_.load(std::memory_order_acquire);
    const std::uint64_t t = tail_.load(std::memory_order_acquire);
    return t > h ? static_cast<std::size_t>(t - h) : 0;
  }
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return tail_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return cap_; }

 private:
  struct alignas(kCacheLine) Slot {
    std::atomic<std::uint64_t> turn;
    Cell cell;
  };
  static_assert(sizeof(Slot) == kCacheLine);

  struct Split {
    std::size_t idx;
    std::uint64_t lap;
  };
  Split split(std::uint64_t pos) const noexcept {
    if (mask_ != 0 || cap_ == 1) return {static_cast<std::size_t>(pos & mask_), pos >> shift_};
    return {static_cast<std::size_t>(pos % cap_), pos / cap_};
  }

  Slot* slots_ = nullptr;
  std::size_t cap_;
  std::uint64_t mask_ = 0;
  unsigned shift_ = 0;
  alignas(kCacheLine) std::atomic<std::uint64_t> tail_{0};
  alignas(kCacheLine) std::atomic<std::uint64_t> head_{0};
};

class TaskQueue {
 public:
  static constexpr std::size_t kMaxRing = std::size_t{1} << 16;
  static constexpr std::size_t kUnbounded = static_cast<std::size_t>(-1);

  explicit TaskQueue(std::size_t capacity)
      : ring_(capacity < kMaxRing ? capacity : kMaxRing),
        spill_cap_(capacity == kUnbounded ? kUnbounded
                   : capacity > kMaxRing  ? capacity - kMaxRing
                                          : 0) {}
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    if (spill_cap_ == 0) return ring_.try_push(fill);
    if (spill_size_.load(std::memory_order_acquire) == 0 && ring_.try_push(fill)) return true;
    return push_spill(fill);
  }

  bool try_pop(Cell& out) noexcept {
    if (ring_.try_pop(out)) return true;
    return spill_cap_ != 0 && spill_size_.load(std::memory_order_acquire) != 0 && pop_spill(out);
  }

  [[nodiscard]] std::size_t size() const noexcept {
    return ring_.size() + spill_size_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  // Approximate under concurrency; callers re-try the push either way.
  [[nodiscard]] bool full() const noexcept {
    if (spill_cap_ == kUnbounded) return false;
    return size() >= ring_.capacity() + spill_cap_;
  }
  // Cells ever pushed (ring and spill): the basis of the "submitted" counter.
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return ring_.pushed() + spill_pushed_.load(std::memory_order_relaxed);
  }

 private:
  template <class Fill>
  bool push_spill(Fill& fill) noexcept {
    MutexLock lock(spill_mu_);
    if (spill_.size() >= spill_cap_) return false;
    try {
      fill(spill_.emplace_back());
    } catch (...) {  // deque growth failed: report full rather than lose the task
      return false;
    }
    spill_size_.store(spill_.size(), std::memory_order_release);
    spill_pushed_.store(spill_pushed_.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
    return true;
  }
  bool pop_spill(Cell& out) noexcept {
    MutexLock lock(spill_mu_);
    // The ring may have been refilled before the spill was used; take it first.
    if (ring_.try_pop(out)) return true;
    if (spill_.empty()) return false;
    spill_.front().relocate_to(out);
    spill_.pop_front();
    spill_size_.store(spill_.size(), std::memory_order_release);
    return true;
  }

  Ring ring_;
  const std::size_t spill_cap_;
  alignas(kCacheLine) std::atomic<std::size_t> spill_size_{0};
  std::atomic<std::uint64_t> spill_pushed_{0};
  Mutex spill_mu_;
  std::deque<Cell> spill_ CREW_GUARDED_BY(spill_mu_);
};

}  // namespace crew::detail

// crew/detail/ring.hpp: detail::Ring, a bounded multi-producer
// multi-consumer ring of cells (Vyukov style, with per-slot turn numbers so
// zero-initialised memory is a valid empty ring and pages are touched only
// when used). One per shard of the pool's queue (queues.hpp).
//
// A slot is one cache line: 8-byte turn + 56-byte cell. A consumer moves the
// cell out before running it, so a slow task never holds a slot.
//
// Who touches what:
//   producers: tail_ (CAS) and the slot they claimed
//   consumers: head_ (CAS) and the slot they claimed
//   anyone:    size() (a racy snapshot)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/cell.hpp"

namespace crew::detail {

// The memory of a ring's slots: zeroed, aligned for `align`; large rings
// are mapped, so that their pages are touched (and count as resident) only
// as the queue fills them (src/base/ring_memory.cpp). Throws std::bad_alloc.
void* allocate_ring_memory(std::size_t bytes, std::size_t align);
void release_ring_memory(void* p, std::size_t bytes) noexcept;

// Which shard of a sharded queue (queues.hpp) the calling thread pushes to,
// before masking: each thread that submits gets the next index once, so
// concurrent producers land on different shards.
inline std::size_t producer_index() noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t index = next.fetch_add(1, std::memory_order_relaxed);
  return index;
}

class Ring {
 public:
  explicit Ring(std::size_t capacity) : cap_(capacity) {
    if ((cap_ & (cap_ - 1)) == 0) {
      mask_ = cap_ - 1;
      shift_ = static_cast<unsigned>(__builtin_ctzll(cap_));
    }
    slots_ = static_cast<Slot*>(allocate_ring_memory(bytes(), alignof(Slot)));
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() { release_ring_memory(slots_, bytes()); }  // the owner drains it first

  // Calls fill(Cell&) on a claimed slot. fill must not throw.
  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      auto [idx, lap] = split(pos);
      Slot& s = slots_[idx];
      const std::uint64_t turn = s.turn.load(std::memory_order_acquire);
      if (turn == 2 * lap) {
        // seq_cst claim: a worker about to sleep re-checks the claimed tail
        // (size()), and the submitter reads the sleepers after this; one of
        // them sees the other. The publication can then be a plain release:
        // a worker that sees the claim but not yet the cell spins for it.
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_seq_cst,
                                        std::memory_order_relaxed)) {
          fill(s.cell);
          s.turn.store(2 * lap + 1, std::memory_order_release);
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
    return try_pop_batch(
               out, [](std::size_t) { return false; }, [](Cell&) noexcept {}) != 0;
  }

  // Takes the oldest cell into `out` and the published cells right after
  // it while more(n) (n: the cells taken so far) allows, each handed to
  // sink(Cell&) (which moves it out and must not throw), all with one claim
  // of head_: 0 if the ring looks empty (or a producer is still writing its
  // oldest slot), else how many.
  template <class More, class Sink>
  std::size_t try_pop_batch(Cell& out, More&& more, Sink&& sink) noexcept {
    std::uint64_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      auto [idx, lap] = split(pos);
      Slot& s = slots_[idx];
      const std::uint64_t turn = s.turn.load(std::memory_order_acquire);
      if (turn == 2 * lap + 1) {
        std::size_t n = 1;
        while (more(n) && published(pos + n)) ++n;
        // seq_cst claim: a blocked submitter re-checks size() after it
        // announced its wait (see Submission::route_full), as the tail claim
        // pairs with sleeping workers.
        if (head_.compare_exchange_weak(pos, pos + n, std::memory_order_seq_cst,
                                        std::memory_order_relaxed)) {
          // Newest first, so that a sink that stacks them (a worker's local
          // queue, popped newest first) gives them back oldest first.
          for (std::size_t k = n; k-- > 1;) {
            auto [i, l] = split(pos + k);
            sink(slots_[i].cell);
            slots_[i].turn.store(2 * l + 2, std::memory_order_release);
          }
          s.cell.relocate_to(out);
          s.turn.store(2 * lap + 2, std::memory_order_release);
          return n;
        }
      } else if (turn < 2 * lap + 1) {
        return 0;  // empty (or a producer is still writing this slot)
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // Claimed slots, published or not (seq_cst: see the claims above).
  [[nodiscard]] std::size_t size() const noexcept {
    const std::uint64_t h = head_.load(std::memory_order_seq_cst);
    const std::uint64_t t = tail_.load(std::memory_order_seq_cst);
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

  std::size_t bytes() const noexcept { return cap_ * sizeof(Slot); }

  // Whether the cell at `pos` is written and not yet taken.
  bool published(std::uint64_t pos) const noexcept {
    auto [idx, lap] = split(pos);
    return slots_[idx].turn.load(std::memory_order_acquire) == 2 * lap + 1;
  }

  // Zeroed memory aligned for Slot: all turns 0 (= free for lap 0), cells
  // empty.
  Slot* slots_ = nullptr;
  std::size_t cap_;
  std::uint64_t mask_ = 0;
  unsigned shift_ = 0;
  alignas(kCacheLine) std::atomic<std::uint64_t> tail_{0};
  alignas(kCacheLine) std::atomic<std::uint64_t> head_{0};
};

}  // namespace crew::detail

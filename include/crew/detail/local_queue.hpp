// crew/detail/local_queue.hpp: detail::LocalQueue, a worker's own queue.
//
// A task submitted from inside a worker goes to that worker's own queue, a
// bounded work-stealing deque (Chase and Lev, in the C11 formulation of Le,
// Pop, Cohen and Zappa Nardelli, 2013). The owner pushes and pops at the
// bottom, newest first, so a task that waits for the tasks it just forked
// finds them on top; other threads steal from the top, oldest first, which
// for divide-and-conquer is the biggest piece of work. A worker that finds
// its queue empty also moves a batch of the shared queue's oldest cells
// into it (push_moved, from Queues::pop_batch in queues.hpp), newest
// first, so that it pops them oldest first.
//
// Who touches what:
//   owner (one thread at a time):  bottom_, and the cells at the bottom
//   thieves (any thread):          top_ (compare-exchange), the cell they won
//   both:                          a slot's `busy` flag, set by the owner's
//                                  push, cleared by whoever moved the cell out;
//                                  moved_, counted up by the owner's
//                                  push_moved, down by whoever takes such a cell
// A cell is moved out only after its index was won (a thief's CAS on top_,
// or the owner's pop), so no cell is copied speculatively; `busy` keeps the
// owner from refilling a slot a slow thief is still moving out of, which
// is the only way a bounded ring could reuse a slot too early.
//
// The algorithm needs a full fence in the owner's pop and one in each
// steal, so that the two cannot both miss each other's index. Pops are as
// frequent as tasks and steals are rare in fork-join (a steal takes the
// oldest, biggest piece of work: on 2 workers, a benchmark process running
// fib(30), 2.7 million tasks per run, several times stole fewer than a
// hundred times in all), so the pop pays only a light_fence and the
// thief a heavy_fence (barrier.hpp). A batch moved in from the shared
// queue is stolen from only when the shared queue runs dry. A queue that is
// stolen from often (a worker's task posting many small tasks that others
// take) would make every
// steal a system call: once thieves have stolen kHeavySteals times within
// kHeavyWindowNs, they ask the owner to switch the queue to full fences on
// both sides (`fenced_`, for the rest of the queue's life).
//
// A pool's table of these queues, one slot per worker, is LocalQueues
// (local_queues.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "crew/detail/assert.hpp"
#include "crew/detail/barrier.hpp"
#include "crew/detail/cell.hpp"
#include "crew/detail/clock.hpp"

namespace crew::detail {

class LocalQueue {
 public:
  static constexpr std::size_t kCapacity = 512;  // 32 KiB of slots

  // Thieves that made kHeavySteals heavy steals within kHeavyWindowNs ask
  // for full fences (see the top of this file).
  static constexpr std::uint32_t kHeavySteals = 16;
  static constexpr std::int64_t kHeavyWindowNs = 1'000'000;

  // `heavy_steals` and `heavy_window_ns`: the constants but in tests,
  // which cannot rely on thieves being scheduled within a millisecond.
  explicit LocalQueue(std::uint32_t heavy_steals = kHeavySteals,
                      std::int64_t heavy_window_ns = kHeavyWindowNs)
      : slots_(std::make_unique<Slot[]>(kCapacity)),
        heavy_steals_(heavy_steals),
        heavy_window_ns_(heavy_window_ns) {}
  LocalQueue(const LocalQueue&) = delete;
  LocalQueue& operator=(const LocalQueue&) = delete;

  // Owner only. Calls fill(Cell&) on the next slot; false when full. The
  // bottom is published with a release store and a light_fence: a shutdown
  // that changed the pool's state runs heavy_fence before it sweeps the
  // queues, so either it sees this cell or the pusher sees the new state
  // (barrier.hpp, which also says what a worker going to sleep may miss).
  template <class Fill>
  bool try_push(Fill& fill) noexcept {
    return push(fill, /*counted=*/true, /*moved=*/false);
  }
  // Owner only: a cell that is no submission (a forked child's step,
  // crew/detail/coro_fork.hpp): not counted in pushed().
  template <class Fill>
  bool try_push_uncounted(Fill& fill) noexcept {
    return push(fill, /*counted=*/false, /*moved=*/false);
  }

  // Owner only: whether the push `ahead` pushes from now would succeed
  // (thieves only ever make room, so it still will when made).
  [[nodiscard]] bool can_push(std::size_t ahead) const noexcept {
    return has_room(bottom_.load(std::memory_order_relaxed) + static_cast<std::int64_t>(ahead));
  }

  // Owner only: moves in a cell taken from the shared queue, where it was
  // counted as submitted already. can_push(0) must hold.
  void push_moved(Cell& from) noexcept {
    auto fill = [&from](Cell& c) noexcept { from.relocate_to(c); };
    [[maybe_unused]] const bool pushed = push(fill, /*counted=*/false, /*moved=*/true);
    CREW_ASSERT(pushed, "LocalQueue::push_moved without can_push()");
  }

  // Owner only: the newest cell.
  bool try_pop(Cell& out) noexcept {
    const std::int64_t b = bottom_.load(std::memory_order_relaxed) - 1;
    if (b < top_.load(std::memory_order_relaxed)) return false;  // empty: no fence needed
    bottom_.store(b, std::memory_order_relaxed);
    owner_fence();
    std::int64_t t = top_.load(std::memory_order_relaxed);
    // The restores of bottom_ below are release stores: a thief's acquire
    // load may read them, and since C++20 a later relaxed store of the
    // owner no longer continues the release sequence of the push that
    // wrote the slot, so a relaxed one would not carry the slot's contents
    // to the thief (free on x86; a formal data race otherwise).
    if (t > b) {
      bottom_.store(b + 1, std::memory_order_release);
      return false;
    }
    if (t == b) {
      // The last cell: a thief may be after it too.
      const bool won = top_.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst,
                                                    std::memory_order_relaxed);
      bottom_.store(b + 1, std::memory_order_release);
      if (!won) return false;
    }
    take(slot(b), out);
    return true;
  }

  // Owner only: the newest cell if `take_it(cell)` says so, looked at in
  // place; otherwise it stays where it was. Never the last cell in the
  // queue, which a thief may be taking (a join clearing its own forked
  // children's cells, crew/detail/coro_fork.hpp, leaves that one stale).
  template <class Pred>
  bool try_pop_if(Pred&& take_it, Cell& out) noexcept {
    const std::int64_t b = bottom_.load(std::memory_order_relaxed) - 1;
    if (b <= top_.load(std::memory_order_relaxed)) return false;  // empty, or one cell
    bottom_.store(b, std::memory_order_relaxed);
    owner_fence();
    const std::int64_t t = top_.load(std::memory_order_relaxed);
    // With t < b no thief can reach index b while bottom_ is b.
    if (t >= b || !take_it(slot(b).cell)) {
      bottom_.store(b + 1, std::memory_order_release);  // as try_pop's restores
      return false;
    }
    take(slot(b), out);
    return true;
  }

  // Any thread: the oldest cell.
  bool try_steal(Cell& out) noexcept {
    for (;;) {
      std::int64_t t = top_.load(std::memory_order_acquire);
      // Looks empty: no fence (a racing push is found by the next look).
      if (t >= bottom_.load(std::memory_order_acquire)) return false;
      thief_fence();
      const std::int64_t b = bottom_.load(std::memory_order_acquire);
      if (t >= b) return false;
      if (top_.compare_exchange_strong(t, t + 1, std::memory_order_seq_cst,
                                       std::memory_order_relaxed)) {
        take(slot(t), out);
        return true;
      }
      // Lost to another thief or the owner: try the next one.
    }
  }

  // Cells in the queue (seq_cst reads, for the sleep protocol; what they
  // can miss of a racing light push is in barrier.hpp).
  [[nodiscard]] std::size_t size() const noexcept {
    const std::int64_t b = bottom_.load(std::memory_order_seq_cst);
    const std::int64_t t = top_.load(std::memory_order_seq_cst);
    return b > t ? static_cast<std::size_t>(b - t) : 0;
  }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  // Whether pops and steals use full fences (see the top of this file).
  [[nodiscard]] bool fenced() const noexcept { return fenced_.load(std::memory_order_acquire); }
  // Cells push_moved() brought in that nobody has taken yet (a racy
  // snapshot).
  [[nodiscard]] std::uint32_t moved() const noexcept {
    return moved_.load(std::memory_order_relaxed);
  }
  // Cells ever pushed (written by the owner, read by anyone).
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return pushed_.load(std::memory_order_relaxed);
  }

 private:
  // Owner only: whether index `b` may be filled: the ring has room for it
  // and no slow thief is still moving out of its slot.
  [[nodiscard]] bool has_room(std::int64_t b) const noexcept {
    return b - top_.load(std::memory_order_acquire) < static_cast<std::int64_t>(kCapacity) &&
           !slot(b).busy.load(std::memory_order_acquire);
  }

  // `counted`: a submission, counted in pushed_; `moved`: brought in from
  // the shared queue (push_moved), where it was counted.
  template <class Fill>
  bool push(Fill& fill, bool counted, bool moved) noexcept {
    const std::int64_t b = bottom_.load(std::memory_order_relaxed);
    if (!has_room(b)) return false;
    Slot& s = slot(b);
    fill(s.cell);
    s.busy.store(true, std::memory_order_relaxed);
    s.moved = moved;
    if (counted) {
      // Counted before it can run: "submitted" never trails an outcome.
      pushed_.store(pushed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else if (moved) {
      moved_.fetch_add(1, std::memory_order_relaxed);
    }
    bottom_.store(b + 1, std::memory_order_release);
    light_fence();
    return true;
  }

  struct alignas(64) Slot {
    std::atomic<bool> busy{false};
    // Set by the owner's push, read by whoever wins the cell (published
    // with it): the cell came from the shared queue (push_moved).
    bool moved = false;
    Cell cell;
  };
  static_assert(sizeof(Slot) == 64);

  // The pop's fence: light while the queue is not `fenced_`. The switch is
  // stored before this pop reads top_, and a thief that reads it (acquire)
  // sees every earlier light pop's bottom_, so it may then use a plain fence.
  [[gnu::always_inline]] void owner_fence() noexcept {
    if (!fenced_.load(std::memory_order_relaxed)) [[likely]] {
      if (!want_fence_.load(std::memory_order_relaxed)) [[likely]] {
        light_fence();
        return;
      }
      fenced_.store(true, std::memory_order_release);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  // The steal's fence: heavy while the owner may pop with a light one.
  void thief_fence() noexcept {
    if (fenced_.load(std::memory_order_acquire) ||
        !g_light_fences.load(std::memory_order_relaxed)) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      return;
    }
    heavy_fence();
    // Counting heavy steals per window; races between thieves only blur
    // the count.
    const std::int64_t now = now_ns();
    if (now - window_start_ns_.load(std::memory_order_relaxed) > heavy_window_ns_) {
      window_start_ns_.store(now, std::memory_order_relaxed);
      heavy_in_window_.store(1, std::memory_order_relaxed);
    } else if (heavy_in_window_.fetch_add(1, std::memory_order_relaxed) + 1 >= heavy_steals_) {
      want_fence_.store(true, std::memory_order_relaxed);
    }
  }

  Slot& slot(std::int64_t i) noexcept {
    return slots_[static_cast<std::size_t>(i) & (kCapacity - 1)];
  }
  const Slot& slot(std::int64_t i) const noexcept {
    return slots_[static_cast<std::size_t>(i) & (kCapacity - 1)];
  }
  void take(Slot& s, Cell& out) noexcept {
    if (s.moved) moved_.fetch_sub(1, std::memory_order_relaxed);
    s.cell.relocate_to(out);
    s.busy.store(false, std::memory_order_release);
  }

  std::unique_ptr<Slot[]> slots_;
  const std::uint32_t heavy_steals_;
  const std::int64_t heavy_window_ns_;
  alignas(64) std::atomic<std::int64_t> top_{0};
  alignas(64) std::atomic<std::int64_t> bottom_{0};
  std::atomic<std::uint64_t> pushed_{0};
  std::atomic<std::uint32_t> moved_{0};  // moved cells not yet taken
  std::atomic<bool> fenced_{false};      // written by the owner
  std::atomic<bool> want_fence_{false};  // written by thieves, once
  // Thieves' window of heavy steals.
  alignas(64) std::atomic<std::int64_t> window_start_ns_{0};
  std::atomic<std::uint32_t> heavy_in_window_{0};
};

}  // namespace crew::detail

// crew/detail/queues.hpp: the pool's queue of cells.
//
// Shards of bounded multi-producer multi-consumer rings (ring.hpp), each
// with a spill queue behind it (spill_queue.hpp) for capacities above
// kMaxRing or unbounded queues.
//
// Who touches what:
//   producers (submitters from outside the pool, and workers whose local
//              queue is full): a shard's ring tail or its spill's tail
//   consumers (workers, waits that help, shutdown sweeps): a shard's ring
//              head or its spill's head
//   anyone:    size() and empty() (racy snapshots)
// All state is private to its class; Queues (at the end) ties the shared
// queue's priority levels to the worker-local queues (local_queues.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "crew/detail/cell.hpp"
#include "crew/detail/local_queue.hpp"
#include "crew/detail/local_queues.hpp"
#include "crew/detail/newest_first.hpp"
#include "crew/detail/ring.hpp"
#include "crew/detail/spill_queue.hpp"

namespace crew::detail {

// One shard: a ring, plus (for large or unbounded capacities) a spill queue
// behind it. While the spill is non-empty new cells go to the spill too, so
// order within the shard stays FIFO.
class Shard {
 public:
  static constexpr std::size_t kUnbounded = static_cast<std::size_t>(-1);

  Shard(std::size_t ring_capacity, std::size_t spill_capacity)
      : ring_(ring_capacity), spill_cap_(spill_capacity) {
    if (spill_cap_ != 0) spill_ = std::make_unique<SpillQueue>(spill_cap_);
  }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    if (spill_cap_ == 0) return ring_.try_push(fill);
    if (!spill_->active_for_producer() && ring_.try_push(fill)) return true;
    return spill_->try_push(fill);
  }

  bool try_pop(Cell& out) noexcept { return ring_.try_pop(out) || pop_spill(out); }

  // The ring, for a push that may skip try_push: null if a spill queue sits
  // behind it (its pushes must check the spill first).
  [[nodiscard]] Ring* plain_ring() noexcept { return spill_cap_ == 0 ? &ring_ : nullptr; }

  // Rings smaller than this give one cell at a time: cells a batch moves
  // out no longer count against the capacity, and in a ring this size or
  // larger that is at most Queues::kMaxBatch - 1 per worker against 256
  // slots.
  static constexpr std::size_t kMinBatchRing = 256;

  // try_pop, taking more than one cell from a ring of kMinBatchRing slots
  // or more (Ring::try_pop_batch), and one at most from the spill.
  template <class More, class Sink>
  std::size_t try_pop_batch(Cell& out, More& more, Sink& sink) noexcept {
    if (ring_.capacity() < kMinBatchRing) return try_pop(out) ? 1 : 0;
    if (const std::size_t n = ring_.try_pop_batch(out, more, sink)) return n;
    return pop_spill(out) ? 1 : 0;
  }

  [[nodiscard]] std::size_t size() const noexcept {
    return ring_.size() + (spill_cap_ == 0 ? 0 : spill_->size());
  }
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return ring_.pushed() + (spill_cap_ == 0 ? 0 : spill_->pushed());
  }

 private:
  // The spill's oldest cell once the ring looked empty.
  bool pop_spill(Cell& out) noexcept {
    if (spill_cap_ == 0 || !spill_->may_have_items()) return false;
    // The ring may have been refilled before the spill was used; order
    // within the shard is kept by taking the ring first.
    return spill_->try_pop(out) || ring_.try_pop(out);
  }

  Ring ring_;
  const std::size_t spill_cap_;
  std::unique_ptr<SpillQueue> spill_;
};

// The pool's queue: a power-of-two number of shards. A submitting thread
// pushes to "its" shard (picked once per thread), so producers do not
// contend on one tail, and a producer preempted in the middle of a push
// (its slot claimed, not yet published) holds up only its own shard. A
// consumer scans from the shard where it last found work. Order is FIFO per
// producer, not across producers. The capacity is split across shards; a
// push to a full shard tries the others before the queue counts as full.
class TaskQueue {
 public:
  static constexpr std::size_t kMaxRing = std::size_t{1} << 16;  // ring slots per shard
  static constexpr std::size_t kUnbounded = Shard::kUnbounded;

  TaskQueue(std::size_t capacity, std::size_t shards) {
    std::size_t n = 1;
    while (n * 2 <= shards && n * 2 <= capacity) n *= 2;
    mask_ = n - 1;
    shards_ = std::make_unique<std::unique_ptr<Shard>[]>(n);
    for (std::size_t i = 0; i < n; ++i) {
      // This shard's share of the capacity: a ring of up to kMaxRing slots
      // (calloc'ed, so pages are touched only as they fill), the rest spill.
      const std::size_t share =
          capacity == kUnbounded ? kUnbounded : capacity / n + (i < capacity % n ? 1 : 0);
      const std::size_t ring = share < kMaxRing ? share : kMaxRing;
      const std::size_t spill = share == kUnbounded ? kUnbounded : share - ring;
      shards_[i] = std::make_unique<Shard>(ring, spill);
    }
  }
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    const std::size_t home = producer_index() & mask_;
    if (shards_[home]->try_push(fill)) [[likely]]
      return true;
    for (std::size_t i = 1; i <= mask_; ++i) {
      if (shards_[(home + i) & mask_]->try_push(fill)) return true;
    }
    return false;
  }

  // `hint`: the consumer's shard of last success in its low kShardBits, and
  // its pops so far above them (updated). A consumer stays on the shard that
  // last had work (locality), but every kRotate-th pop starts at the next
  // shard: a producer that keeps its shard fed cannot starve the others.
  bool try_pop(Cell& out, std::size_t& hint) noexcept {
    return scan(hint, [&](Shard& s) { return s.try_pop(out); });
  }
  // try_pop, with Shard::try_pop_batch on each shard: how many it took.
  template <class More, class Sink>
  std::size_t try_pop_batch(Cell& out, std::size_t& hint, More&& more, Sink&& sink) noexcept {
    std::size_t n = 0;
    scan(hint, [&](Shard& s) { return (n = s.try_pop_batch(out, more, sink)) != 0; });
    return n;
  }
  bool try_pop(Cell& out) noexcept {
    std::size_t hint = 0;
    return try_pop(out, hint);
  }

  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i <= mask_; ++i) n += shards_[i]->size();
    return n;
  }
  [[nodiscard]] bool empty() const noexcept {
    for (std::size_t i = 0; i <= mask_; ++i) {
      if (shards_[i]->size() != 0) return false;
    }
    return true;
  }
  // Cells ever pushed: the basis of the "submitted" counter.
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    std::uint64_t n = 0;
    for (std::size_t i = 0; i <= mask_; ++i) n += shards_[i]->pushed();
    return n;
  }
  [[nodiscard]] std::size_t shards() const noexcept { return mask_ + 1; }
  // Shard `i`'s Shard::plain_ring(), for a push that goes to the calling
  // thread's home shard (producer_index()) without this class.
  [[nodiscard]] Ring* plain_ring(std::size_t i) noexcept { return shards_[i]->plain_ring(); }

 private:
  // Calls pop(Shard&) on each shard in the order try_pop describes, until
  // one returns true; updates `hint`.
  template <class Pop>
  bool scan(std::size_t& hint, Pop&& pop) noexcept {
    static constexpr unsigned kShardBits = 8;
    static constexpr std::size_t kRotate = 16;
    const std::size_t pops = hint >> kShardBits;
    const std::size_t first =
        (hint & ((std::size_t{1} << kShardBits) - 1)) + (pops % kRotate == kRotate - 1 ? 1 : 0);
    for (std::size_t i = 0; i <= mask_; ++i) {
      const std::size_t k = (first + i) & mask_;
      if (pop(*shards_[k])) {
        hint = ((pops + 1) << kShardBits) | k;
        return true;
      }
    }
    return false;
  }

  std::unique_ptr<std::unique_ptr<Shard>[]> shards_;
  std::size_t mask_ = 0;
};

// What one consumer remembers between pops: the shard where it last found
// work, and, for priority levels, how many tasks it took from higher levels
// while each lower level had work waiting.
struct PopState {
  static constexpr std::size_t kMaxLevels = 16;
  std::size_t hint = 0;
  std::uint32_t passed_over[kMaxLevels] = {};
  // The consumer's local queue slot (a worker's), or LocalQueues::kNone.
  std::size_t local = LocalQueues::kNone;
  // Pops so far: every kSharedFirst-th pop looks at the shared queue before
  // the local one, so a worker busy with forked work still serves it.
  std::uint32_t ticks = 0;
  // Cells the last batch pop moved into the local queue (see pop_batch);
  // the consumer reads and clears it (PoolCore::after_batch).
  std::uint32_t moved = 0;
  // Pops while a level had newest-first cells (see pop_level).
  std::uint32_t standing = 0;
};

// The pool's queues: the shared queue, one TaskQueue per priority level (one
// in all for a pool without priorities, which then pays one predictable
// branch per operation), and the worker-local queues (local_queue.hpp).
//
// Order of a worker's pop: its own local queue (newest first), then the
// shared queue (a batch, see pop_batch), then stealing from the other local
// queues (oldest first); every kSharedFirst-th pop takes the shared queue
// first, so forked work cannot starve submissions from outside (Go's
// scheduler checks its global queue every 61 ticks for the same reason),
// except while cells of a batch are still in the local queue: they are
// older than anything in the shared queue, and one worker runs one
// submitter's tasks in order.
//
// Aging rule: a consumer takes from the highest level that has work, except
// that a lower level with work waiting is served first once this consumer
// has taken `aging` tasks from levels above it since that level was last
// served or empty. So the oldest task of a waiting level is taken after at
// most `aging` higher-level tasks by any one consumer (at most
// consumers x aging in all); aging counts service, not time, so it needs no
// clock reads. Pools with priority levels submit every task to the shared
// queue, local queues are for single-level pools.
//
// Newest first: a pool with the overload controller has, per level, a
// stack (newest_first.hpp) beside the FIFO rings, where admitted tasks go
// while the controller reports a standing queue (try_push_newest). A
// level with cells there gives its newest first, except every other pop,
// which takes the level's oldest: the ring's, or, with the ring empty, the
// stack's bottom. What queued before the standing queue still drains, and
// so does the bottom of a stack that never empties (CoDel sheds what waited
// too long when it comes up); neither holds an admission ticket until its
// queue deadline. A pool without the controller has no stacks and pays
// one predictable branch per pop of the shared queue.
class Queues {
 public:
  static constexpr std::uint32_t kSharedFirst = 61;

  Queues(std::size_t capacity, std::size_t shards, std::size_t levels, std::uint32_t aging,
         bool newest_first = false)
      : aging_(aging) {
    for (std::size_t i = 0; i < levels; ++i) {
      levels_.push_back(std::make_unique<TaskQueue>(capacity, shards));
      if (newest_first)
        newest_.push_back(std::make_unique<NewestFirst>(std::min(capacity, TaskQueue::kMaxRing)));
    }
  }
  Queues(const Queues&) = delete;
  Queues& operator=(const Queues&) = delete;

  [[nodiscard]] std::size_t levels() const noexcept { return levels_.size(); }
  [[nodiscard]] LocalQueues& locals() noexcept { return locals_; }
  [[nodiscard]] TaskQueue& level(std::size_t level) noexcept { return *levels_[level]; }

  template <class Fill>
  bool try_push(Fill&& fill, std::size_t level) noexcept {
    return levels_[level]->try_push(fill);
  }
  // To the newest-first stack of `level` (a pool with the overload
  // controller only); false when it is full.
  template <class Fill>
  bool try_push_newest(Fill&& fill, std::size_t level) noexcept {
    if (!newest_[level]->try_push(fill)) return false;
    standing_cells_.fetch_add(1, std::memory_order_seq_cst);  // see after_push
    return true;
  }
  // Moves the newest cell of the lowest level below `level` that has
  // newest-first cells into `out`: a cell a higher priority displaces. The
  // level it came from, or `level` if none had one.
  std::size_t take_newest_below(std::size_t level, Cell& out) noexcept {
    if (newest_.empty() || standing_cells_.load(std::memory_order_relaxed) == 0) return level;
    for (std::size_t l = 0; l < level; ++l) {
      if (pop_newest(l, out)) return l;
    }
    return level;
  }
  // Owner of slot `local` only.
  template <class Fill>
  bool try_push_local(Fill&& fill, std::size_t local) noexcept {
    return locals_.at(local).try_push(fill);
  }

  // A worker's pop (see the order above).
  bool try_pop(Cell& out, PopState& st) noexcept {
    if (st.local != LocalQueues::kNone) {
      LocalQueue& mine = locals_.at(st.local);
      // Not while cells of a batch wait in the local queue: they are older
      // than any in the shared queue.
      if (++st.ticks % kSharedFirst == 0 && mine.moved() == 0 && pop_shared(out, st)) return true;
      if (mine.try_pop(out)) return true;
      if (levels_.size() == 1) [[likely]] {
        if (standing()) [[unlikely]]
          return pop_level(0, out, st) || locals_.try_steal(out, st.hint, st.local);
        return pop_batch(out, st, mine) || locals_.try_steal(out, st.hint, st.local);
      }
    }
    return pop_shared(out, st) || locals_.try_steal(out, st.hint, st.local);
  }
  // Any thread's pop: shared queue first, then stealing.
  bool try_pop(Cell& out) noexcept {
    PopState st;
    return try_pop(out, st);
  }
  // The owner's newest local cell only.
  bool pop_own(Cell& out, const PopState& st) noexcept {
    return st.local != LocalQueues::kNone && locals_.at(st.local).try_pop(out);
  }
  // Anything but the caller's own local queue.
  bool pop_foreign(Cell& out, PopState& st) noexcept {
    return pop_shared(out, st) || locals_.try_steal(out, st.hint, st.local);
  }

  [[nodiscard]] std::size_t size() const noexcept { return shared_size() + locals_.size(); }
  [[nodiscard]] std::size_t shared_size() const noexcept {
    std::size_t n = 0;
    for (std::size_t l = 0; l < levels_.size(); ++l) n += level_size(l);
    return n;
  }
  [[nodiscard]] bool empty() const noexcept {
    for (std::size_t l = 0; l < levels_.size(); ++l) {
      if (!level_empty(l)) return false;
    }
    return locals_.empty();
  }
  [[nodiscard]] std::size_t level_size(std::size_t level) const noexcept {
    return levels_[level]->size() + (newest_.empty() ? 0 : newest_[level]->size());
  }
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    std::uint64_t n = locals_.pushed();
    for (const auto& q : levels_) n += q->pushed();
    for (const auto& q : newest_) n += q->pushed();
    return n;
  }

 private:
  bool pop_shared(Cell& out, PopState& st) noexcept {
    if (levels_.size() == 1) [[likely]] {
      if (standing()) [[unlikely]]
        return pop_level(0, out, st);
      return levels_[0]->try_pop(out, st.hint);
    }
    return pop_prioritized(out, st);
  }

  // Whether any level has newest-first cells (never without the controller).
  [[nodiscard]] bool standing() const noexcept {
    return !newest_.empty() && standing_cells_.load(std::memory_order_relaxed) != 0;
  }
  bool pop_newest(std::size_t level, Cell& out) noexcept {
    if (!newest_[level]->try_pop(out)) return false;
    standing_cells_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  // One level's pop: its newest-first cell when it has one, except every
  // other such pop takes the level's oldest (see the class comment).
  bool pop_level(std::size_t level, Cell& out, PopState& st) noexcept {
    if (!standing() || newest_[level]->size() == 0) return levels_[level]->try_pop(out, st.hint);
    if (++st.standing % 2 == 0 &&
        (levels_[level]->try_pop(out, st.hint) || pop_oldest(level, out))) {
      return true;
    }
    return pop_newest(level, out) || levels_[level]->try_pop(out, st.hint);
  }
  bool pop_oldest(std::size_t level, Cell& out) noexcept {
    if (!newest_[level]->try_pop_oldest(out)) return false;
    standing_cells_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  [[nodiscard]] bool level_empty(std::size_t level) const noexcept {
    return levels_[level]->empty() && (newest_.empty() || newest_[level]->size() == 0);
  }

  // A worker whose local queue is empty takes from the shared queue a
  // batch of what is published there in a row, at most kMaxBatch cells
  // (Go's scheduler moves part of its global queue into the local queue
  // the same way). The first cell goes to `out`, the others to the
  // worker's local queue, where it takes them oldest first and idle
  // workers may steal them. Workers then take turns on a shard's head once
  // per batch instead of once per task, and the tasks of a batch run one
  // after another on one CPU instead of alternating between CPUs over the
  // lines they share. docs/notes/2026-11-27-shared-queue-batches.md has
  // the measurements.
  bool pop_batch(Cell& out, PopState& st, LocalQueue& mine) noexcept {
    auto more = [&mine](std::size_t taken) {
      return taken < kMaxBatch && mine.can_push(taken - 1);
    };
    auto sink = [&](Cell& c) noexcept { mine.push_moved(c); };
    const std::size_t n = levels_[0]->try_pop_batch(out, st.hint, more, sink);
    st.moved = n > 1 ? static_cast<std::uint32_t>(n - 1) : 0;
    return n != 0;
  }

  bool pop_prioritized(Cell& out, PopState& st) noexcept {
    const std::size_t n = levels_.size();
    std::size_t top = n;
    for (std::size_t l = n; l-- > 0;) {
      if (!level_empty(l)) {
        top = l;
        break;
      }
    }
    if (top == n) return false;
    // A waiting lower level whose turn has come (the lowest first).
    for (std::size_t l = 0; l < top; ++l) {
      if (st.passed_over[l] >= aging_ && pop_level(l, out, st)) {
        st.passed_over[l] = 0;
        return true;
      }
    }
    for (std::size_t l = top + 1; l-- > 0;) {
      if (pop_level(l, out, st)) {
        st.passed_over[l] = 0;
        for (std::size_t lower = 0; lower < l; ++lower) {
          st.passed_over[lower] = level_empty(lower) ? 0 : st.passed_over[lower] + 1;
        }
        return true;
      }
    }
    return false;
  }

  static constexpr std::size_t kMaxBatch = 8;

  std::vector<std::unique_ptr<TaskQueue>> levels_;
  const std::uint32_t aging_;
  LocalQueues locals_;
  // Per level, with the overload controller only (else empty).
  std::vector<std::unique_ptr<NewestFirst>> newest_;
  // Cells in all of newest_: written by their pushes and pops only, so a
  // pool that is not overloaded only ever reads it.
  alignas(kCacheLine) std::atomic<std::size_t> standing_cells_{0};
};

}  // namespace crew::detail

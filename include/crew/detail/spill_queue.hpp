// crew/detail/spill_queue.hpp: detail::SpillQueue, the unbounded (or
// large) part of a shard of the pool's queue (queues.hpp), behind its ring.
//
// Who touches what:
//   producers: the tail block, pushed_ and cached_popped_, under tail_mu_
//   consumers: the head block, popped_ and cached_pushed_, under head_mu_
//   anyone:    size() (exact at the moment of the call)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/cell.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

// The unbounded part of a shard: a linked list of blocks of cells with one
// lock for producers (the tail) and one for consumers (the head), so pushes
// and pops never contend with each other (Michael & Scott's two-lock queue,
// with blocks instead of nodes: one allocation per kBlockCells cells).
//
// Each side keeps the other side's counter cached and reads the real one
// (a line the other side writes on every operation) only when the cache
// says it might matter: a consumer when the spill looks empty, a producer
// every kRefresh pushes. Under a backlog neither side touches the other's
// hot line.
class SpillQueue {
 public:
  static constexpr std::size_t kUnboundedSpill = static_cast<std::size_t>(-1);

  explicit SpillQueue(std::size_t capacity) : cap_(capacity) {
    Block* first = new Block;
    head_ = first;
    tail_ = first;
  }
  SpillQueue(const SpillQueue&) = delete;
  SpillQueue& operator=(const SpillQueue&) = delete;
  ~SpillQueue() CREW_NO_THREAD_SAFETY_ANALYSIS {  // the owner drains it first
    Block* b = head_;
    while (b != nullptr) {
      Block* next = b->next.load(std::memory_order_relaxed);
      delete b;
      b = next;
    }
  }

  template <class Fill>
  bool try_push(Fill& fill) noexcept {
    SpinLockGuard lock(tail_mu_);
    const std::uint64_t pushed = pushed_.load(std::memory_order_relaxed);
    if (cap_ != kUnboundedSpill &&
        pushed - cached_popped_.load(std::memory_order_relaxed) >= cap_) {
      cached_popped_.store(popped_.load(std::memory_order_acquire), std::memory_order_relaxed);
      if (pushed - cached_popped_.load(std::memory_order_relaxed) >= cap_) return false;
    }
    Block* b = tail_;
    std::size_t n = b->written.load(std::memory_order_relaxed);
    if (n == kBlockCells) {
      Block* fresh = new (std::nothrow) Block;
      if (fresh == nullptr) return false;  // out of memory: report full, lose nothing
      b->next.store(fresh, std::memory_order_release);
      tail_ = b = fresh;
      n = 0;
    }
    // Claimed before it is published, as the ring does: a read-modify-write,
    // seq_cst (the sleepers' Dekker pair). A consumer that pops the cell
    // and counts its outcome must find it counted as pushed already, or
    // stats() could show more outcomes than submissions and wait_idle()
    // return while a task runs. A consumer that sees the claim before the
    // cell is written finds nothing to pop and looks again.
    pushed_.fetch_add(1, std::memory_order_seq_cst);
    fill(b->cells[n]);
    b->written.store(n + 1, std::memory_order_release);
    return true;
  }

  bool try_pop(Cell& out) noexcept {
    SpinLockGuard lock(head_mu_);
    Block* b = head_;
    if (b->read == kBlockCells) {
      Block* next = b->next.load(std::memory_order_acquire);
      if (next == nullptr) return false;
      head_ = next;
      delete b;  // the producer moved on when it published `next`
      b = next;
    }
    if (b->read == b->written.load(std::memory_order_acquire)) return false;
    b->cells[b->read++].relocate_to(out);
    popped_.fetch_add(1, std::memory_order_seq_cst);
    return true;
  }

  // For consumers: false only if the spill was empty a moment ago.
  [[nodiscard]] bool may_have_items() noexcept {
    const std::uint64_t popped = popped_.load(std::memory_order_relaxed);
    if (cached_pushed_.load(std::memory_order_relaxed) > popped) return true;
    const std::uint64_t pushed = pushed_.load(std::memory_order_seq_cst);
    cached_pushed_.store(pushed, std::memory_order_relaxed);
    return pushed > popped;
  }

  // For producers: whether to keep pushing here (FIFO within the shard)
  // rather than to the ring. Stays true up to kRefresh pushes after the
  // spill drained.
  [[nodiscard]] bool active_for_producer() noexcept {
    const std::uint64_t pushed = pushed_.load(std::memory_order_relaxed);
    if (pushed == cached_popped_.load(std::memory_order_relaxed)) return false;
    if (pushed % kRefresh == 0) {
      const std::uint64_t popped = popped_.load(std::memory_order_acquire);
      cached_popped_.store(popped, std::memory_order_relaxed);
      return pushed != popped;
    }
    return true;
  }

  // Exact at the moment of the call (seq_cst: the claim protocol).
  [[nodiscard]] std::size_t size() const noexcept {
    const std::uint64_t popped = popped_.load(std::memory_order_seq_cst);
    const std::uint64_t pushed = pushed_.load(std::memory_order_seq_cst);
    return pushed > popped ? static_cast<std::size_t>(pushed - popped) : 0;
  }
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return pushed_.load(std::memory_order_relaxed);
  }

 private:
  static constexpr std::size_t kBlockCells = 254;  // a block is about 14 KiB
  static constexpr std::uint64_t kRefresh = 64;
  struct Block {
    alignas(kCacheLine) std::atomic<std::size_t> written{0};  // producers
    std::atomic<Block*> next{nullptr};                        // producers
    alignas(kCacheLine) std::size_t read = 0;                 // consumers, under head_mu_
    Cell cells[kBlockCells];
  };
  const std::size_t cap_;
  // Producers' line.
  alignas(kCacheLine) SpinLock tail_mu_;
  Block* tail_ CREW_GUARDED_BY(tail_mu_) = nullptr;
  std::atomic<std::uint64_t> pushed_{0};
  std::atomic<std::uint64_t> cached_popped_{0};
  // Consumers' line.
  alignas(kCacheLine) SpinLock head_mu_;
  Block* head_ CREW_GUARDED_BY(head_mu_) = nullptr;
  std::atomic<std::uint64_t> popped_{0};
  std::atomic<std::uint64_t> cached_pushed_{0};
};

}  // namespace crew::detail

// src/engine/blocked_submitters.hpp (private): submitters blocked on a pool's full
// shared queue, and how they are released: in batches, not one per freed
// slot. A submitter that finds its priority level full waits until the
// level is down to half its capacity (the low-water mark), then pushes;
// pops wake all sleeping submitters at that mark.
//
// Why a mark and not the first free slot: a producer that pushes as soon
// as one slot frees runs in lock-step with the consumers, each push on the
// line a pop has just written, and one push per pop. From the mark, the
// producer fills half the queue in one run while the workers take the
// other half. And one wake-up per sleep: the pops between a release and
// the woken submitter's first run make no syscall (before, each of them
// woke it again: 15 % of the workers' time with one producer and the
// default capacity). docs/notes/2026-11-26-bounded-queue.md has the measurements.
//
// Who touches what:
//   enter / leave / wait    a submitter that found the queue full (its own
//                           thread; counted for max_blocked_submitters and
//                           PoolStats::blocked_submitters)
//   slot_freed              any thread that took a cell out of the shared
//                           queue (workers, helping waits, sweeps); a
//                           thread-local count samples the queue's size
//   release_all             shutdown: the blocked submitters then see
//                           `closed`
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "crew/detail/queues.hpp"
#include "crew/detail/spin_lock.hpp"
#include "event_count.hpp"

namespace crew::detail {

class BlockedSubmitters {
 public:
  // `level_capacity`: the capacity of each priority level of the shared
  // queue (kUnbounded: nobody ever blocks); `levels`: how many there are.
  BlockedSubmitters(std::size_t level_capacity, std::size_t levels) noexcept
      : low_water_(level_capacity / 2),
        check_every_(static_cast<std::uint32_t>(std::clamp<std::size_t>(low_water_ / 64, 1, 16))),
        single_level_(levels == 1) {}
  BlockedSubmitters(const BlockedSubmitters&) = delete;
  BlockedSubmitters& operator=(const BlockedSubmitters&) = delete;

  // Counts the caller as blocked, unless `limit` (0: none) are already:
  // then false, and the caller is refused.
  bool enter(std::size_t limit) noexcept {
    if (blocked_.fetch_add(1, std::memory_order_seq_cst) >= limit && limit != 0) {
      blocked_.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void leave() noexcept { blocked_.fetch_sub(1, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t count() const noexcept {
    return blocked_.load(std::memory_order_relaxed);
  }

  // A level's size at or below which its blocked submitters go on.
  [[nodiscard]] std::size_t low_water() const noexcept { return low_water_; }

  // Waits while above_low_water() holds, until `give_up` at the latest: a
  // short spin (a queue of a few slots drains in less than a futex round
  // trip), then sleeps until a release, at most a millisecond at a time.
  // above_low_water() is checked after announcing each sleep, so a release
  // between the two is not missed.
  template <class AboveLowWater>
  void wait(AboveLowWater&& above_low_water,
            std::chrono::steady_clock::time_point give_up =
                std::chrono::steady_clock::time_point::max()) noexcept {
    static constexpr int kSpins = 64;
    for (int spins = 0; above_low_water(); ++spins) {
      if (spins < kSpins) {
        cpu_relax();
        continue;
      }
      const EventCount::Key key = ec_.prepare_wait();
      asleep_.store(true, std::memory_order_seq_cst);
      if (!above_low_water()) {
        ec_.cancel_wait();
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= give_up) {
        ec_.cancel_wait();
        return;
      }
      (void)ec_.wait(key, std::min(give_up, now + std::chrono::milliseconds(1)));
    }
  }

  // A cell left the shared queue `q`: any thread that popped one, while
  // it returns from the pop. The size is looked at every check_every_ cells
  // a thread frees (it reads every shard's indices, lines the other
  // consumers write on each pop), so consumers do not pay for it on every
  // pop; the stride is at most 1/64 of the low-water mark, so a release
  // comes at most consumers x stride cells late. A blocked submitter also
  // looks again every millisecond, which bounds the cost of a release this
  // sampling misses. In a pool with priority levels a pop does not know
  // which level a waiter waits on: besides the whole queue's mark, it wakes
  // them all every kReleaseBatch cells it frees, and each looks at its own
  // level.
  void slot_freed(const Queues& q) noexcept {
    static constexpr std::uint32_t kReleaseBatch = 256;
    if (ec_.waiters() == 0) [[likely]]
      return;
    static thread_local std::uint32_t freed = 0;
    ++freed;
    if (!single_level_ && freed % kReleaseBatch == 0) {
      release();
      return;
    }
    if (freed % check_every_ != 0) return;
    // The whole shared queue at the mark: every level is at or below it.
    if (q.shared_size() <= low_water_) release();
  }

  void release_all() noexcept { ec_.notify_all(); }

 private:
  // One wake-up per sleep: the pops that follow a release, until the
  // woken submitters have run, find asleep_ clear and make no syscall.
  // A submitter sets it after announcing its sleep and before its last
  // look at the queue, so a pop that made that look stale sees it set (or
  // an earlier pop cleared it and woke the sleeper after its announcement).
  void release() noexcept {
    if (asleep_.load(std::memory_order_seq_cst) &&
        asleep_.exchange(false, std::memory_order_seq_cst)) {
      ec_.notify_all();
    }
  }

  EventCount ec_;
  const std::size_t low_water_;
  const std::uint32_t check_every_;
  const bool single_level_;
  std::atomic<bool> asleep_{false};
  alignas(kCacheLine) std::atomic<std::size_t> blocked_{0};
};

}  // namespace crew::detail

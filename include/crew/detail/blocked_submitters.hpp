// crew/detail/blocked_submitters.hpp: submitters blocked on a pool's full
// shared queue, and how they are released: in batches, not one per freed
// slot (all of them once the shared queue is down to its low-water mark, and
// every kReleaseBatch freed cells so that none waits on a priority level
// that stays full).
//
// Who touches what:
//   enter / leave / sleep   a submitter that found the queue full (its own
//                           thread; counted for max_blocked_submitters and
//                           PoolStats::blocked_submitters)
//   slot_freed              any thread that took a cell out of the shared
//                           queue (workers, helping waits, sweeps); a
//                           thread-local count samples the queue's size
//   release_all             shutdown: the blocked submitters then see
//                           `closed`
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "crew/detail/event_count.hpp"
#include "crew/detail/task_queue.hpp"

namespace crew::detail {

class BlockedSubmitters {
 public:
  // `low_water`: the shared queue's size at which all are released.
  explicit BlockedSubmitters(std::size_t low_water) noexcept : low_water_(low_water) {}
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

  // Sleeps until a release, at most a millisecond; returns at once if
  // still_blocked() (checked after announcing the sleep, so a release
  // between the two is not missed) is false.
  template <class StillBlocked>
  void sleep(StillBlocked&& still_blocked) noexcept {
    const EventCount::Key key = ec_.prepare_wait();
    if (!still_blocked()) {
      ec_.cancel_wait();
      return;
    }
    (void)ec_.wait(key, std::chrono::steady_clock::now() + std::chrono::milliseconds(1));
  }

  // A cell left the shared queue `q`. In large queues the size is looked at
  // every kCheckEvery cells a thread frees (it reads every shard's indices),
  // so consumers do not pay for it on every pop; a blocked submitter also
  // looks again every millisecond, which bounds the cost of a release this
  // sampling misses.
  void slot_freed(const Queues& q) noexcept {
    static constexpr std::uint32_t kCheckEvery = 16;
    static constexpr std::uint32_t kReleaseBatch = 256;
    if (ec_.waiters() == 0) [[likely]]
      return;
    static thread_local std::uint32_t freed = 0;
    ++freed;
    if (low_water_ >= 1024 && freed % kCheckEvery != 0) return;
    if (freed % kReleaseBatch == 0 || q.shared_size() <= low_water_) ec_.notify_all();
  }

  void release_all() noexcept { ec_.notify_all(); }

 private:
  EventCount ec_;
  const std::size_t low_water_;
  alignas(kCacheLine) std::atomic<std::size_t> blocked_{0};
};

}  // namespace crew::detail

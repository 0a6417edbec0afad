// crew/detail/local_queues.hpp: detail::LocalQueues, the table of a pool's
// worker-local queues (LocalQueue, local_queue.hpp), one slot per worker.
//
// Ownership of a queue passes from a worker that exits to the next worker
// that claims its slot (claim / release, under a mutex), so a queue an
// exiting worker leaves non-empty is still stolen from, and later owned
// again. A queue is never freed before the pool.
//
// Who touches what:
//   workers starting and exiting: claim and release, under mu_
//   the owner of a slot:          its queue's bottom (through at())
//   thieves and counters (any):   published_ and used_ (acquire loads)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "crew/detail/cell.hpp"
#include "crew/detail/local_queue.hpp"
#include "crew/detail/mutex.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

// The local queues of one pool: a fixed table of slots, each a queue
// created on first use. A worker claims a slot when it starts and releases
// it when it exits; workers beyond kSlots have none and submit to the shared
// queue. Thieves scan slots [0, used()).
class LocalQueues {
 public:
  static constexpr std::size_t kSlots = 256;
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  LocalQueues() = default;
  LocalQueues(const LocalQueues&) = delete;
  LocalQueues& operator=(const LocalQueues&) = delete;

  // The lowest free slot (its queue may still hold cells a previous owner
  // left), or kNone. Thread-safe.
  std::size_t claim() {
    MutexLock lock(mu_);
    for (std::size_t i = 0; i < kSlots; ++i) {
      if (owned_[i]) continue;
      if (!queues_[i]) queues_[i] = std::make_unique<LocalQueue>();
      owned_[i] = true;
      if (i >= used_.load(std::memory_order_relaxed)) {
        published_[i].store(queues_[i].get(), std::memory_order_release);
        used_.store(i + 1, std::memory_order_release);
      }
      return i;
    }
    return kNone;
  }
  void release(std::size_t i) noexcept {
    if (i == kNone) return;
    MutexLock lock(mu_);
    owned_[i] = false;
  }

  // The queue of a claimed slot (owner), or of any slot below used().
  [[nodiscard]] LocalQueue& at(std::size_t i) const noexcept {
    return *published_[i].load(std::memory_order_acquire);
  }
  [[nodiscard]] std::size_t used() const noexcept { return used_.load(std::memory_order_acquire); }

  // Steals one cell from any queue but `skip`, starting after `from`.
  bool try_steal(Cell& out, std::size_t from, std::size_t skip) const noexcept {
    const std::size_t n = used();
    for (std::size_t k = 1; k <= n; ++k) {
      const std::size_t i = (from + k) % n;
      if (i != skip && at(i).try_steal(out)) return true;
    }
    return false;
  }

  [[nodiscard]] std::size_t size() const noexcept {
    std::size_t sum = 0;
    for (std::size_t i = 0, n = used(); i < n; ++i) sum += at(i).size();
    return sum;
  }
  [[nodiscard]] bool empty() const noexcept {
    for (std::size_t i = 0, n = used(); i < n; ++i) {
      if (!at(i).empty()) return false;
    }
    return true;
  }
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    std::uint64_t sum = 0;
    for (std::size_t i = 0, n = used(); i < n; ++i) sum += at(i).pushed();
    return sum;
  }

 private:
  Mutex mu_;
  std::unique_ptr<LocalQueue> queues_[kSlots] CREW_GUARDED_BY(mu_);
  bool owned_[kSlots] CREW_GUARDED_BY(mu_) = {};
  std::atomic<LocalQueue*> published_[kSlots] = {};
  std::atomic<std::size_t> used_{0};
};

}  // namespace crew::detail

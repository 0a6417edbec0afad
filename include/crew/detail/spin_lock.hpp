// crew/detail/spin_lock.hpp: a tiny lock for critical sections of a few
// instructions: per-task and per-worker bookkeeping, almost never
// contended, where a std::mutex would double the state's size; and the
// pool's timer heap, contended while the pool is busy, whose sections are
// one sift (src/engine/timer_heap.hpp says what a mutex cost there). A waiter
// yields its CPU after 64 looks, so a holder that lost its CPU gets it
// back. And cpu_relax(), the pause of every spin-wait in the pool.
#pragma once

#include <atomic>
#include <thread>

#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

// One pause of a spin-wait: tells the CPU the loop waits on memory another
// core writes (cheaper on the sibling hyper-thread and on the bus).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class CREW_CAPABILITY("mutex") SpinLock {
 public:
  SpinLock() noexcept = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void lock() noexcept CREW_ACQUIRE() {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  // Takes the lock if no thread holds it; never waits.
  [[nodiscard]] bool try_lock() noexcept CREW_TRY_ACQUIRE(true) {
    return !flag_.load(std::memory_order_relaxed) &&
           !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept CREW_RELEASE() { flag_.store(false, std::memory_order_release); }
  // True if no thread holds the lock at this moment. Seen true after an
  // acquire read of a value written inside a critical section, it means
  // that section has ended (the unlock it reads from, or a later one, is
  // ordered after everything the section did).
  [[nodiscard]] bool is_free() const noexcept { return !flag_.load(std::memory_order_acquire); }
  // For functions whose callers hold the lock (named *_locked).
  void assert_held() const noexcept CREW_ASSERT_CAPABILITY(this) {}

 private:
  std::atomic<bool> flag_{false};
};

class CREW_SCOPED_CAPABILITY SpinLockGuard {
 public:
  explicit SpinLockGuard(SpinLock& mu) CREW_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~SpinLockGuard() CREW_RELEASE() { mu_.unlock(); }
  SpinLockGuard(const SpinLockGuard&) = delete;
  SpinLockGuard& operator=(const SpinLockGuard&) = delete;

 private:
  SpinLock& mu_;
};

}  // namespace crew::detail

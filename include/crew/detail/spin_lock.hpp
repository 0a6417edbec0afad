// crew/detail/spin_lock.hpp: a tiny lock for critical sections of a few
// instructions: per-task and per-worker bookkeeping, almost never
// contended, where a std::mutex would double the state's size; the pool's
// timer heap and spill queue, contended while the pool is busy, whose
// sections are one sift or one link (src/engine/timer_heap.hpp says what a
// mutex cost there). A waiter spins, yields, then sleeps in short naps
// until the lock is free, so a holder that lost its CPU gets it
// back whatever the waiter's scheduling: a waiter that only yielded would
// keep the CPU from a preempted holder on its own CPU if it ran under a
// real-time policy or a higher one than the holder's. And cpu_relax(), the
// pause of every spin-wait in the pool.
#pragma once

#include <atomic>

#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

// One pause of a spin-wait: tells the CPU the loop waits on memory another
// core writes (cheaper on the sibling hyper-thread and on the bus).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The lock is one byte and its unlock a plain store. A futex that an
// unlock wakes needs a 32-bit word and a read-modify-write on each unlock;
// either cost crew_bench's short_future 4-9 % (the spill queue's locks and
// the per-task ones are on its path). Hence naps of a set length, which no
// unlock ends.
class CREW_CAPABILITY("mutex") SpinLock {
 public:
  SpinLock() noexcept = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  // Waits for the holder's unlock: looks 64 times, yields 16 times, then
  // naps, from 20 us up to 1 ms at a time, until the lock is free. May be
  // called from any thread, a pool's workers included.
  void lock() noexcept CREW_ACQUIRE() {
    int looks = 0;
    int waits = 0;
    while (word_.exchange(true, std::memory_order_acquire)) {
      while (word_.load(std::memory_order_relaxed)) {
        if (looks < kLooks) {
          ++looks;
        } else {
          waits = back_off(waits);
        }
      }
    }
  }
  // Takes the lock if no thread holds it; never waits.
  [[nodiscard]] bool try_lock() noexcept CREW_TRY_ACQUIRE(true) {
    return !word_.load(std::memory_order_relaxed) &&
           !word_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept CREW_RELEASE() { word_.store(false, std::memory_order_release); }
  // True if no thread holds the lock at this moment. Seen true after an
  // acquire read of a value written inside a critical section, it means
  // that section has ended (the unlock it reads from, or a later one, is
  // ordered after everything the section did).
  [[nodiscard]] bool is_free() const noexcept { return !word_.load(std::memory_order_acquire); }
  // For functions whose callers hold the lock (named *_locked).
  void assert_held() const noexcept CREW_ASSERT_CAPABILITY(this) {}

 private:
  static constexpr int kLooks = 64;
  // One wait after the first kLooks, `waits` of them made before: a yield
  // for the first 16, then a nap (src/base/spin_lock.cpp). Returns the
  // count to pass next time.
  static int back_off(int waits) noexcept;

  std::atomic<bool> word_{false};  // held
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

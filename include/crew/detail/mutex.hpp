// crew/detail/mutex.hpp: std::mutex with clang thread-safety attributes, and
// its scoped lock. libstdc++'s std::mutex carries no capability attributes,
// so members guarded by one could not be checked by -Wthread-safety.
//
// Condition variables wait on MutexLock::native(); write the wait as a loop
// in the locking function (`while (!ready) cv.wait(lock.native());`) so that
// the analysis sees the guarded reads under the lock.
#pragma once

#include <mutex>

#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

class CREW_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() CREW_ACQUIRE() { mu_.lock(); }
  void unlock() CREW_RELEASE() { mu_.unlock(); }
  // For functions whose callers hold the lock (named *_locked): tells the
  // analysis so from here on. No run-time check.
  void assert_held() const CREW_ASSERT_CAPABILITY(this) {}
  std::mutex& native() noexcept { return mu_; }

 private:
  std::mutex mu_;
};

class CREW_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) CREW_ACQUIRE(mu) : lock_(mu.native()) {}
  ~MutexLock() CREW_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // For std::condition_variable; the lock is held again when a wait returns.
  std::unique_lock<std::mutex>& native() noexcept { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace crew::detail

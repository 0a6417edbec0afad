// What several coroutine tests share: the frame counter (a FrameGuard lives
// in each frame that holds one, so that a test can tell that every frame
// was destroyed, and on which thread) and a task that sleeps and counts its
// end.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "crew/coro.hpp"

namespace crew::test {

class FrameGuard {
 public:
  FrameGuard() { alive_.fetch_add(1); }
  ~FrameGuard() {
    {
      const std::lock_guard lock(mu_);
      destroyed_on_.push_back(std::this_thread::get_id());
    }
    alive_.fetch_sub(1);
  }
  FrameGuard(const FrameGuard&) = delete;
  FrameGuard& operator=(const FrameGuard&) = delete;

  [[nodiscard]] static int alive() { return alive_.load(); }
  // The threads that destroyed guarded frames since reset().
  [[nodiscard]] static std::vector<std::thread::id> destroyed_on() {
    const std::lock_guard lock(mu_);
    return destroyed_on_;
  }
  static void reset() {
    alive_ = 0;
    const std::lock_guard lock(mu_);
    destroyed_on_.clear();
  }

 private:
  static inline std::atomic<int> alive_{0};
  static inline std::mutex mu_;
  static inline std::vector<std::thread::id> destroyed_on_;
};

// Sleeps `d` on its pool's timer heap, then adds 1 to `*done` (not run if
// the sleep ends by a stop: Errc::cancelled leaves the frame at the await).
inline Co<void> counting_sleeper(std::chrono::milliseconds d, std::atomic<int>* done) {
  co_await sleep_for(d);
  done->fetch_add(1);
}

}  // namespace crew::test

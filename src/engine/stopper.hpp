// src/engine/stopper.hpp (private): the thread that fires a pool's stop requests
// for the supervisor. A stop request runs the task's stop callbacks, which
// are user code: on a thread of its own, a slow callback never delays a
// deadline, a write-off or a replacement. Started on first use.
//
// Who touches what: everything is under the stopper's own mutex.
//   hand      the supervisor (its deadline and grace-period scans)
//   the loop  the stopper thread: takes what was handed, fires it outside
//             the lock
//   stop      the thread in PoolControl::stop_supervisor, after the supervisor
//             exited: the loop fires what is left, then ends, and is joined
#pragma once

#include <condition_variable>
#include <stop_token>
#include <thread>
#include <vector>

#include "crew/detail/mutex.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "crew/task_status.hpp"

namespace crew::detail {

// What to stop, taken under a worker's run.mu (or from the timer heap) and
// fired outside it (stop callbacks are user code).
struct StopTarget {
  TaskStateBase* task = nullptr;  // holds a reference
  std::stop_source source{std::nostopstate};
  StopReason reason = StopReason::none;
  void fire() noexcept;
};

class Stopper {
 public:
  Stopper() = default;
  Stopper(const Stopper&) = delete;
  Stopper& operator=(const Stopper&) = delete;
  ~Stopper() { stop(); }

  // Fires `targets` on the stopper thread (starting it if need be), or on
  // the calling thread if it cannot start or the stopper was stopped.
  // `targets` is empty on return.
  void hand(std::vector<StopTarget>& targets) noexcept;
  // Fires what was handed and joins the thread. Nothing may be handed
  // after it (what is, is fired on the caller's thread).
  void stop() noexcept;

 private:
  void loop() noexcept;

  Mutex mu_;
  std::vector<StopTarget> stops_ CREW_GUARDED_BY(mu_);
  bool exit_ CREW_GUARDED_BY(mu_) = false;
  std::condition_variable ready_;
  std::thread thread_;  // started under mu_; joined by stop()
};

}  // namespace crew::detail

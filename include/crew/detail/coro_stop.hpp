// crew/detail/coro_stop.hpp: the stop of a coroutine task beyond what its
// task state records (TaskStateBase keeps the reason, the first one wins):
// the std::stop_token it hands out, made only when someone asks for it
// (current_stop_token()), and the coroutine tasks spawned from it, which
// are stopped with it.
//
// A child links itself into its parent's list when it is spawned and takes
// itself out when it ends, holding a reference to the parent's task state
// in between (the parent may end first). No std::stop_callback and no
// std::stop_source per task: a spawn from a coroutine costs a short spin
// lock section on the parent.
//
// Thread-safety: stop() from any thread (the one that stopped the task,
// after its state recorded the reason); token() from any thread; link()
// on the spawning thread before the task is shared; unlink() on the thread
// that ends the task (and by the destructor, for a task that never ran).
#pragma once

#include <stop_token>

#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

class TaskStateBase;

class CoroStop {
 public:
  CoroStop() noexcept = default;
  CoroStop(const CoroStop&) = delete;
  CoroStop& operator=(const CoroStop&) = delete;
  ~CoroStop() { unlink(); }

  // The task `self` runs under this stop; `parent` (with its state) is the
  // coroutine task that spawned it, or null. A parent stopped already
  // stops `self` at once (StopReason::cancelled).
  void link(TaskStateBase& self, CoroStop* parent, TaskStateBase* parent_state) noexcept;
  // How many coroutine tasks spawned it, one from the other (0: spawned
  // from outside a coroutine task). Set by link(), then never changes.
  [[nodiscard]] unsigned depth() const noexcept { return depth_; }
  // Leaves the parent's list and lets its state go. Idempotent.
  void unlink() noexcept;
  // The token of the task: stopped once stop() ran (or at once, if made
  // after the state recorded a stop). Makes the source on the first call
  // (a global allocation; on failure, a token that is never stopped).
  [[nodiscard]] std::stop_token token() noexcept;
  // The task was stopped: stops the token handed out, if any (its
  // callbacks run here), and each child (StopReason::cancelled). Only the
  // first call acts.
  void stop() noexcept;

 private:
  SpinLock mu_;
  std::stop_source source_ CREW_GUARDED_BY(mu_){std::nostopstate};
  CoroStop* children_ CREW_GUARDED_BY(mu_) = nullptr;
  bool stopped_ CREW_GUARDED_BY(mu_) = false;

  TaskStateBase* self_ = nullptr;
  unsigned depth_ = 0;
  // As a child: set by link(), cleared by unlink(); the links are guarded
  // by the parent's mu_.
  CoroStop* parent_ = nullptr;
  TaskStateBase* parent_state_ = nullptr;  // a reference until unlink()
  CoroStop* prev_ = nullptr;
  CoroStop* next_ = nullptr;
  CoroStop* stop_next_ = nullptr;  // the parent's stop() walk (its thread only)
};

}  // namespace crew::detail

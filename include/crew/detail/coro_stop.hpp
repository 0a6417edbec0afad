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
// The list is also how the pool's registry (src/coro/coro_hub.hpp) reaches
// a child: a child linked to its parent is not listed in the registry
// itself, the registry walks the lists of the tasks it lists. A task that
// ends with children still linked hands them to the registry first
// (hand_off), so that every live task stays reachable from a listed one.
//
// Thread-safety: stop() from any thread (the one that stopped the task,
// after its state recorded the reason); token() and for_each_child() from
// any thread; link() on the spawning thread before the task is shared;
// hand_off() and unlink() on the thread that ends the task (and unlink()
// by the destructor, for a task that never ran).
#pragma once

#include <atomic>
#include <stop_token>

#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

class TaskStateBase;
class CoroTaskBase;

class CoroStop {
 public:
  CoroStop() noexcept = default;
  CoroStop(const CoroStop&) = delete;
  CoroStop& operator=(const CoroStop&) = delete;
  ~CoroStop() { unlink(); }

  // The task `owner` (its state `self`) runs under this stop; `parent` is
  // the stop of the coroutine task that spawned it, or null. True if it is
  // now in the parent's list; a parent stopped already lists nothing and
  // stops `self` at once (StopReason::cancelled).
  bool link(CoroTaskBase& owner, TaskStateBase& self, CoroStop* parent) noexcept;
  // How many coroutine tasks spawned it, one from the other (0: spawned
  // from outside a coroutine task). Set by link(), then never changes.
  [[nodiscard]] unsigned depth() const noexcept { return depth_; }
  // Leaves the parent's list (unless the parent took it out, hand_off) and
  // lets the parent's state go. Idempotent.
  void unlink() noexcept;
  // Whether a child is linked (the owner's thread, at its end: no child
  // links any more, so a false answer stays false).
  [[nodiscard]] bool has_children() const noexcept {
    return children_.load(std::memory_order_acquire) != nullptr;
  }
  // The task ends (its thread; nothing links to it any more): each child
  // still linked is taken out of the list and given to `enroll` (called
  // under this stop's lock, with the child's task), which lists it in the
  // registry.
  template <class Enroll>
  void hand_off(Enroll enroll) noexcept {
    SpinLockGuard lock(mu_);
    CoroStop* c = children_.load(std::memory_order_relaxed);
    children_.store(nullptr, std::memory_order_relaxed);
    while (c != nullptr) {
      CoroStop* next = c->next_;
      c->prev_ = c->next_ = nullptr;
      c->handed_off_ = true;
      enroll(*c->owner_);
      c = next;
    }
  }
  // Calls f(CoroTaskBase&) for each child linked now, under this stop's
  // lock (f must not block, nor touch this stop).
  template <class F>
  void for_each_child(F f) {
    SpinLockGuard lock(mu_);
    for (CoroStop* c = children_.load(std::memory_order_relaxed); c != nullptr; c = c->next_) {
      f(*c->owner_);
    }
  }
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
  // Written under mu_; read without it only by has_children().
  std::atomic<CoroStop*> children_{nullptr};
  bool stopped_ CREW_GUARDED_BY(mu_) = false;

  CoroTaskBase* owner_ = nullptr;
  TaskStateBase* self_ = nullptr;
  unsigned depth_ = 0;
  // As a child: set by link(), cleared by unlink(); the links are guarded
  // by the parent's mu_.
  CoroStop* parent_ = nullptr;
  TaskStateBase* parent_state_ = nullptr;  // a reference until unlink()
  CoroStop* prev_ = nullptr;
  CoroStop* next_ = nullptr;
  CoroStop* stop_next_ = nullptr;  // the parent's stop() walk (its thread only)
  // Guarded by the parent's mu_: the parent handed this task to the
  // registry when it ended (its prev_ and next_ are null then).
  bool handed_off_ = false;
};

}  // namespace crew::detail

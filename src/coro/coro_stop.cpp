// The stop of a coroutine task: its lazy token and its children
// (crew/detail/coro_stop.hpp).
#include "crew/detail/coro_stop.hpp"

#include <new>
#include <utility>

#include "crew/detail/task_state.hpp"

namespace crew::detail {

bool CoroStop::link(CoroTaskBase& owner, TaskStateBase& self, CoroStop* parent) noexcept {
  owner_ = &owner;
  self_ = &self;
  if (parent == nullptr) return false;
  depth_ = parent->depth_ + 1;  // the parent's, set before it was shared
  bool stop_now = false;
  {
    SpinLockGuard lock(parent->mu_);
    stop_now = parent->stopped_;
    if (!stop_now) {
      parent_ = parent;
      parent_state_ = parent->self_;
      parent_state_->add_ref();
      next_ = parent->children_.load(std::memory_order_relaxed);
      if (next_ != nullptr) next_->prev_ = this;
      parent->children_.store(this, std::memory_order_relaxed);
    }
  }
  if (stop_now) (void)self.request_stop(StopReason::cancelled);
  return !stop_now;
}

void CoroStop::unlink() noexcept {
  if (parent_ == nullptr) return;
  {
    SpinLockGuard lock(parent_->mu_);
    if (!handed_off_) {  // else the parent took it out of its list
      if (prev_ != nullptr) {
        prev_->next_ = next_;
      } else {
        parent_->children_.store(next_, std::memory_order_relaxed);
      }
      if (next_ != nullptr) next_->prev_ = prev_;
    }
  }
  prev_ = next_ = parent_ = nullptr;
  std::exchange(parent_state_, nullptr)->release();
}

std::stop_token CoroStop::token() noexcept {
  {
    SpinLockGuard lock(mu_);
    if (source_.stop_possible()) return source_.get_token();
  }
  std::stop_source made{std::nostopstate};
  try {
    made = std::stop_source();  // allocated outside the lock
  } catch (const std::bad_alloc&) {
    return {};
  }
  bool stop_now = false;
  {
    SpinLockGuard lock(mu_);
    if (source_.stop_possible()) {
      made = source_;  // another thread made it meanwhile
    } else {
      source_ = made;
    }
    // The state records a stop before stop() runs: a token asked for in
    // between (by the task, woken by its own stop) reads stopped too.
    stop_now = stopped_ || self_->stop_reason() != StopReason::none;
  }
  // A stop that came first found no source to stop: stopped here.
  if (stop_now) (void)made.request_stop();
  return made.get_token();
}

void CoroStop::stop() noexcept {
  std::stop_source src{std::nostopstate};
  CoroStop* list = nullptr;
  {
    SpinLockGuard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    src = source_;
    // A reference each: a child that ends meanwhile unlinks (waiting for
    // this lock) and may be freed once it let go.
    for (CoroStop* c = children_.load(std::memory_order_relaxed); c != nullptr; c = c->next_) {
      c->self_->add_ref();
      c->stop_next_ = list;
      list = c;
    }
  }
  // Outside the lock: stop callbacks are user code, and a child's stop
  // reaches its own children.
  if (src.stop_possible()) (void)src.request_stop();
  while (list != nullptr) {
    CoroStop* c = std::exchange(list, list->stop_next_);
    TaskStateBase* child = c->self_;
    (void)child->request_stop(StopReason::cancelled);
    child->release();
  }
}

}  // namespace crew::detail

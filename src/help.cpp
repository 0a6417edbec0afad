// Waits that help: a worker (or a thread running a task of the pool) that
// waits for a task runs queued tasks meanwhile, its own newest first, and
// foreign ones only while little of its stack is used, so that recursion
// through waits stays within a bounded stack.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "control.hpp"

namespace crew::detail {
namespace {

// The calling thread's stack, found once per thread.
struct StackBounds {
  std::uintptr_t low = 0;
  std::uintptr_t high = 0;
};
thread_local StackBounds t_stack{};

StackBounds this_stack() noexcept {
  if (t_stack.high == 0) {
    pthread_attr_t attr;
    void* addr = nullptr;
    std::size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      (void)pthread_attr_getstack(&attr, &addr, &size);
      pthread_attr_destroy(&attr);
    }
    const auto low = reinterpret_cast<std::uintptr_t>(addr);
    t_stack = size == 0 ? StackBounds{1, 1} : StackBounds{low, low + size};
  }
  return t_stack;
}

}  // namespace

// Taking a task that is not the caller's own (the shared queue, another
// worker's queue) nests a task of unknown depth on this stack; it is allowed
// while at most 1/kForeignHelpShare of the stack is in use. Own tasks are
// always taken: their nesting follows the program's recursion.
bool stack_allows_help() noexcept {
  constexpr std::uintptr_t kForeignHelpShare = 16;
  const StackBounds b = this_stack();
  if (b.high == b.low) return true;  // unknown: as before
  const char here = 0;
  const auto sp = reinterpret_cast<std::uintptr_t>(&here);
  return sp > b.low && (b.high - sp) * kForeignHelpShare <= b.high - b.low;
}

bool Core::run_pending() { return help_once(/*own=*/true, /*foreign=*/true); }

bool Core::help_once(bool own, bool foreign) {
  if (state() == PoolState::paused) return false;
  Cell cell;
  Worker* w = t_current.core == this ? t_current.worker : nullptr;
  if (w != nullptr) {
    if (!(own && queue_.pop_own(cell, w->pop)) &&
        !(foreign && stack_allows_help() && queue_.pop_foreign(cell, w->pop))) {
      return false;
    }
    w->helped.inc();
  } else {
    if (!foreign || !stack_allows_help() || !queue_.try_pop(cell)) return false;
    helped_.fetch_add(1, std::memory_order_relaxed);
  }
  on_slot_freed();
  settle_popped_here(cell);
  return true;
}

bool Core::help_until(TaskStateBase* s, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  Clock::duration nap = std::chrono::microseconds(50);
  while (!s->done()) {
    // Own newest tasks first: most often `s` and its siblings are among them.
    if (help_once(/*own=*/true, /*foreign=*/false)) continue;
    if (s->leave_queue(TaskStatus::running)) {
      disarm_queue_deadline(s);
      run_claimed_here(s, /*drop_ref=*/false);  // the cell still holds its reference
      return true;
    }
    if (help_once(/*own=*/false, /*foreign=*/true)) {
      nap = std::chrono::microseconds(50);
      continue;
    }
    // It runs elsewhere (stolen, or nested in another wait): sleep on it in
    // short naps, then look for work again (its children may queue here).
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    (void)s->wait_until(deadline - now > nap ? now + nap : deadline);
    nap = std::min<Clock::duration>(nap * 2, std::chrono::milliseconds(1));
  }
  return true;
}

bool is_worker_of(const TaskStateBase* s) noexcept {
  return t_current.core != nullptr && t_current.core == s->owner;
}

int wait_as_worker(TaskStateBase* s, std::chrono::steady_clock::time_point deadline) {
  if (!is_worker_of(s)) return -1;
  return t_current.core->help_until(s, deadline) ? 1 : 0;
}

}  // namespace crew::detail

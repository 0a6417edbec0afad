// crew/detail/coro_fork.hpp: the forked children of a coroutine task
// (crew::fork and crew::Forked, crew/coro.hpp).
//
// A forked child is a Co<R> frame run inside its parent's coroutine task,
// not a task of its own: no task state, id, handle, outcome or stop link,
// so that a fork costs about what a Group's task does. fork() queues a
// ForkCell on the calling worker's own queue, where an idle worker may
// steal it; the join (co_await on the Forked) runs the child on the
// joiner's thread by symmetric transfer if no worker started it, and
// otherwise suspends the joiner until the child ends, when the thread that
// ran the child goes on with the joiner (symmetric transfer again). Neither
// way grows the stack, however deep the recursion.
//
// A ForkCell is a step of the task (as ResumeStep, crew/detail/
// coro_task.hpp) that the pool counts neither as a submission nor as an
// outcome. On a worker it goes to the worker's own queue uncounted
// (Submission::try_push_own_step: no shared counter per fork); elsewhere, or
// when that queue is full, to the shared queue at the task's priority as a
// counted step (step_taken() when it leaves). With neither, the join runs
// the child. The join first takes back, off the top of its worker's queue,
// the cells whose children were joined already and then its own child's
// cell (LocalQueue::try_pop_if); so joins newest first never leave a cell
// behind, and a child whose cell it took needs no read-modify-write of the
// fork word. A cell that finds its child taken by the joiner does nothing
// but let go of the frame; one that finds the task stopped ends the child
// unrun with the stop's error; one dropped by a shutdown leaves the child to
// its joiner, which runs it unless the task was stopped.
//
// Who touches what: the fork word (PromiseBase::fork_word of the child's
// promise) is the only shared field.
//   state bits   queued   made by fork(), not started
//                running  started by its cell (on the cell's thread)
//                waiting  running, and the joiner suspended: the thread
//                         that ends the child resumes the joiner
//                done     ended after its cell started it
//                inline   taken by the joiner, which runs it
//                dropped  let go unstarted (the task was stopped at the
//                         join, or the Forked was destroyed unjoined)
//   kCell        the queued cell still refers to the frame
//   kOwner       the Forked still refers to the frame
// The frame (and the result in its promise) belongs to whoever clears the
// last of kCell and kOwner, who destroys it. `continuation` is written by
// the joiner before it publishes inline or waiting, and read by the
// child's final suspension only in those states.
#pragma once

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <type_traits>
#include <utility>

#include "crew/detail/coro_task.hpp"
#include "crew/error.hpp"

namespace crew::detail {

namespace fork_word {
inline constexpr std::uint32_t kState = 0x7;
inline constexpr std::uint32_t kQueued = 1;
inline constexpr std::uint32_t kRunning = 2;
inline constexpr std::uint32_t kWaiting = 3;
inline constexpr std::uint32_t kDone = 4;
inline constexpr std::uint32_t kInline = 5;
inline constexpr std::uint32_t kDropped = 6;
inline constexpr std::uint32_t kCell = 0x8;
inline constexpr std::uint32_t kOwner = 0x10;
[[nodiscard]] constexpr std::uint32_t state(std::uint32_t w) noexcept { return w & kState; }
[[nodiscard]] constexpr std::uint32_t with_state(std::uint32_t w, std::uint32_t s) noexcept {
  return (w & ~kState) | s;
}
}  // namespace fork_word

// The child's frame, type-erased: what a cell and the shared code need.
struct ForkedFrame {
  std::coroutine_handle<> handle;
  PromiseBase* promise = nullptr;
};

// Lets go of one reference (kCell or kOwner) to the frame; destroys it if
// that was the last (src/coro/coro_fork.cpp).
void fork_release(ForkedFrame f, std::uint32_t ref) noexcept;

// The queued step that starts a forked child on the worker that takes it.
class ForkCell {
 public:
  using step_of_task = void;
  ForkCell(CoroTaskBase* task, ForkedFrame f) noexcept : core_(&task->core()), task_(task), f_(f) {}
  ForkCell(ForkCell&& o) noexcept
      : core_(o.core_),
        task_(o.task_),
        f_(std::exchange(o.f_, ForkedFrame{})),
        counted_(o.counted_) {}
  ForkCell& operator=(ForkCell&&) = delete;
  ForkCell(const ForkCell&) = delete;
  ForkCell& operator=(const ForkCell&) = delete;
  ~ForkCell() {
    if (f_.promise != nullptr) dropped();
  }
  void operator()() noexcept { run(); }
  // The push failed: the frame stays with the Forked, which runs it at the join.
  void disown() noexcept { f_ = ForkedFrame{}; }
  [[nodiscard]] const ForkedFrame& frame() const noexcept { return f_; }
  // Its joiner took it off the queue and keeps the frame (src/coro/
  // coro_fork.cpp): counted as taken, the frame left alone.
  void left_queue() noexcept;
  // Pushed as a counted step (Submission::try_push_step), not to the
  // worker's own queue uncounted: step_taken() when it leaves the queue.
  void set_counted() noexcept { counted_ = true; }

 private:
  void run() noexcept;      // src/coro/coro_fork.cpp
  void dropped() noexcept;  // a shutdown dropped it unrun

  // The task is touched only once the cell started the child: a cell that
  // finds its child taken by the joiner may come up after the task ended.
  PoolCore* core_;
  CoroTaskBase* task_;
  ForkedFrame f_;
  bool counted_ = false;
};

// fork(): queues the child (or keeps it for the join if the queue is full
// or closed). Throws Error(invalid_options) outside a coroutine task.
void fork_start(ForkedFrame f);

// The join's parts that do not depend on the result type.
// await_suspend: returns the frame to go on with on this thread (the child,
// inline; the joiner itself, if the child ended or the task was stopped
// and the child had not started: then `stopped` is set; or
// std::noop_coroutine(), suspended until the child ends).
std::coroutine_handle<> fork_join(ForkedFrame f, std::coroutine_handle<> joiner, bool& stopped);
// A Forked destroyed unjoined: a child not started is never run; a running
// one is waited for (the destructor blocks until it ends), its result and
// exception discarded.
void fork_abandon(ForkedFrame f) noexcept;
// After the join: the task's stop error, thrown when the task was stopped
// before the child started (its frame released).
[[noreturn]] void fork_throw_stopped(ForkedFrame f);

}  // namespace crew::detail

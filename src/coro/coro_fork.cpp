// Forked children of a coroutine task (crew/detail/coro_fork.hpp has the
// fork word and who touches it).
#include "crew/detail/coro_fork.hpp"

#include <thread>

#include "crew/detail/submission.hpp"
#include "run_frame.hpp"

namespace crew::detail {

using namespace fork_word;  // NOLINT(google-build-using-namespace): the states

void fork_release(ForkedFrame f, std::uint32_t ref) noexcept {
  if ((f.promise->fork_word.load(std::memory_order_acquire) & (kCell | kOwner)) == ref) {
    f.handle.destroy();  // the last reference: nobody else can change the word
    return;
  }
  const std::uint32_t old = f.promise->fork_word.fetch_and(~ref, std::memory_order_acq_rel);
  if ((old & (kCell | kOwner)) == ref) f.handle.destroy();
}

void ForkCell::run() noexcept {
  const ForkedFrame f = std::exchange(f_, ForkedFrame{});
  if (counted_) Submission(*core_).step_taken();
  std::uint32_t w = f.promise->fork_word.load(std::memory_order_acquire);
  while (state(w) == kQueued) {
    if (f.promise->fork_word.compare_exchange_weak(
            w, with_state(w, kRunning), std::memory_order_acq_rel, std::memory_order_acquire)) {
      // Started: the joiner (or the Forked's destructor) waits for its end,
      // so the task is alive until then. From here the frame is the
      // child's, and this thread must not touch it after it ends.
      if (!task_->stop_requested()) {
        run_frame(task_, f.handle);
        return;
      }
      // A stopped task starts no more children: it ends unrun with the
      // stop's error, which its join throws.
      try {
        f.promise->error = std::make_exception_ptr(task_->stop_error());
      } catch (...) {
        f.promise->error = std::current_exception();
      }
      const std::coroutine_handle<> next = fork_final(*f.promise);
      if (next != std::noop_coroutine()) run_frame(task_, next);  // the joiner waited
      return;
    }
  }
  fork_release(f, kCell);  // taken by its joiner, or let go by its Forked
}

void ForkCell::left_queue() noexcept {
  f_ = ForkedFrame{};
  if (counted_) Submission(*core_).step_taken();
}

void ForkCell::dropped() noexcept {
  const ForkedFrame f = std::exchange(f_, ForkedFrame{});
  if (counted_) Submission(*core_).step_taken();
  fork_release(f, kCell);  // still queued: the join runs it (or throws, if stopped)
}

void fork_start(ForkedFrame f) {
  CoroTaskBase* const task = current_coro_task();
  if (task == nullptr) {
    f.handle.destroy();
    throw Error(Errc::invalid_options, "crew::fork: called outside a coroutine task");
  }
  f.promise->fork_word.store(kQueued | kOwner | kCell, std::memory_order_relaxed);
  ForkCell cell(task, f);
  // The push publishes the frame (release) to the worker that takes it:
  // the worker's own queue (no shared counter touched), else the shared one.
  Submission submission(task->core());
  if (submission.try_push_own_step(cell)) return;
  cell.set_counted();
  if (!submission.try_push_step(cell, task->level())) {
    cell.disown();  // full or closed: the join runs it
    f.promise->fork_word.store(kQueued | kOwner, std::memory_order_relaxed);
  }
}

namespace {
// On the worker that forked `f`, takes its cell off the top of the
// worker's own queue (its children's cells are above it only while they
// are queued: each join takes its own), and the cells above it whose
// children were taken by their joiners. Otherwise every child run at its
// join would leave a cell in the queue until the worker's loop came to it,
// and a deep recursion would fill the queue with them.
// True if it took `own`'s cell: the frame is then the joiner's alone.
bool take_own_cells(const PoolCore& core, PromiseBase* own) noexcept {
  if (t_current.core != &core || t_current.local_queue == nullptr) return false;
  Cell c;
  while (t_current.local_queue->try_pop_if(
      [own](Cell& cell) noexcept {
        const ForkCell* fc = cell.inline_target<ForkCell>();
        if (fc == nullptr) return false;
        PromiseBase* p = fc->frame().promise;
        return p == own || state(p->fork_word.load(std::memory_order_acquire)) != kQueued;
      },
      c)) {
    ForkCell* fc = c.inline_target<ForkCell>();  // the predicate said it is one
    const bool mine = fc != nullptr && fc->frame().promise == own;
    if (mine) fc->left_queue();  // let go of the frame without touching its word
    c.destroy();                 // a stale one: ForkCell::dropped() lets go of its frame
    if (mine) return true;
  }
  return false;
}
}  // namespace

std::coroutine_handle<> fork_join(ForkedFrame f, std::coroutine_handle<> joiner, bool& stopped) {
  std::atomic<std::uint32_t>& word = f.promise->fork_word;
  std::uint32_t w = word.load(std::memory_order_acquire);
  for (;;) {
    switch (state(w)) {
      case kQueued: {
        CoroTaskBase* const task = current_coro_task();
        // Its cell taken back off this worker's queue, nobody else refers
        // to the frame: a plain store decides, no read-modify-write.
        const bool alone =
            (w & kCell) != 0 && task != nullptr && take_own_cells(task->core(), f.promise);
        if (alone) w &= ~kCell;
        const bool stop = task != nullptr && task->stop_requested();
        const std::uint32_t next = with_state(w, stop ? kDropped : kInline);
        // Written before the state says inline; no other thread reads it
        // while the child is queued or running.
        if (!stop) f.promise->continuation = joiner;
        if (alone) {
          word.store(next, std::memory_order_relaxed);
        } else if (!word.compare_exchange_weak(w, next, std::memory_order_acq_rel,
                                               std::memory_order_acquire)) {
          continue;
        }
        if (stop) {
          stopped = true;
          return joiner;
        }
        return f.handle;  // runs here, and returns to the joiner at its end
      }
      case kRunning:
        f.promise->continuation = joiner;
        if (word.compare_exchange_weak(w, with_state(w, kWaiting), std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
          return std::noop_coroutine();  // the child's end resumes the joiner
        }
        continue;
      default:  // done
        CREW_ASSERT(state(w) == kDone, "a join of a child joined already");
        return joiner;
    }
  }
}

std::coroutine_handle<> fork_final(PromiseBase& p) noexcept {
  std::uint32_t w = p.fork_word.load(std::memory_order_relaxed);
  if (state(w) == kInline) return p.continuation;  // the joiner's own thread
  // Started by its cell: done, and the cell's reference goes (the Forked
  // keeps the frame: it waits for a running child before it goes).
  while (!p.fork_word.compare_exchange_weak(w, with_state(w & ~kCell, kDone),
                                            std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
  CREW_ASSERT((w & kOwner) != 0, "a running forked child lost its Forked");
  if (state(w) == kWaiting) return p.continuation;
  return std::noop_coroutine();
}

void fork_abandon(ForkedFrame f) noexcept {
  std::atomic<std::uint32_t>& word = f.promise->fork_word;
  std::uint32_t w = word.load(std::memory_order_acquire);
  while (state(w) == kQueued) {
    if (word.compare_exchange_weak(w, with_state(w, kDropped), std::memory_order_acq_rel,
                                   std::memory_order_acquire)) {
      fork_release(f, kOwner);  // its cell, if any, destroys it when it comes up
      return;
    }
  }
  // Started by its cell: compute that ends by itself. Wait for it, since
  // its frame may refer to this one's.
  while (state(w) != kDone) {
    std::this_thread::yield();
    w = word.load(std::memory_order_acquire);
  }
  f.handle.destroy();
}

void fork_throw_stopped(ForkedFrame f) {
  CoroTaskBase* const task = current_coro_task();
  fork_release(f, kOwner);
  throw task->stop_error();
}

}  // namespace crew::detail

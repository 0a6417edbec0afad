// Waits that help: a worker (or a thread running a task of the pool) that
// waits for a task runs queued tasks meanwhile, its own newest first, and
// foreign ones only while little of its stack is used, so that recursion
// through waits stays within a bounded stack. Below the stack's reserve a
// wait nests nothing: the task it waits for, if still queued, is cancelled
// and the wait throws Error(stack_exhausted), instead of the stack
// overflowing.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

#include "pool_runtime.hpp"

namespace crew::detail {
namespace {

// The calling thread's stack, found once per thread, with the addresses
// the checks below compare the frame address with (0: no limit).
//
// The reserve a wait keeps: a sixteenth of the stack, at least 32 KiB but
// at most a quarter (8 MiB: 512 KiB; 256 KiB: 32 KiB; 64 KiB: 16 KiB).
struct StackBounds {
  std::uintptr_t low = 0;
  std::uintptr_t high = 0;
  std::uintptr_t help_floor = 0;  // foreign help: above it (1/16 of the stack used)
  std::uintptr_t nest_floor = 0;  // a wait nests a task: above it (low + reserve; own_floor
                                  // where the wait cannot throw)
  std::uintptr_t own_floor = 0;   // own tasks, where waits may throw: low + reserve / 2
  std::uintptr_t hard_floor = 0;  // own tasks, where waits cannot throw: low + reserve / 4
  std::uintptr_t reserve = 0;
};
thread_local StackBounds t_stack{};
thread_local int t_no_stack_throw = 0;  // NoStackThrowScope depth
// Tasks this thread runs nested in a wait made on a stack that is not its
// own (a fiber's, a stackful coroutine's: its size is unknown): one level
// at most, so that such a stack holds one task's frames beyond the wait.
thread_local int t_foreign_nesting = 0;

const StackBounds& this_stack() noexcept {
  if (t_stack.high == 0) [[unlikely]] {
    pthread_attr_t attr;
    void* addr = nullptr;
    std::size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      (void)pthread_attr_getstack(&attr, &addr, &size);
      pthread_attr_destroy(&attr);
    }
    if (size == 0) {
      t_stack = StackBounds{.low = 1, .high = 1};  // unknown: no limits
    } else {
      constexpr std::uintptr_t kMinReserve = 32 * 1024;
      constexpr std::uintptr_t kForeignHelpShare = 16;
      const auto low = reinterpret_cast<std::uintptr_t>(addr);
      const std::uintptr_t reserve = std::min(size / 4, std::max(kMinReserve, size / 16));
      t_stack = StackBounds{.low = low,
                            .high = low + size,
                            .help_floor = low + size - size / kForeignHelpShare,
                            .nest_floor = low + reserve,
                            .own_floor = low + reserve / 2,
                            .hard_floor = low + reserve / 4,
                            .reserve = reserve};
    }
  }
  return t_stack;
}

// The frame's address, not a local's: under AddressSanitizer locals may
// live on a fake stack in the heap.
[[gnu::always_inline]] inline std::uintptr_t stack_pointer() noexcept {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

[[gnu::always_inline]] inline bool foreign(std::uintptr_t sp, const StackBounds& b) noexcept {
  return sp < b.low || sp > b.high;
}

// Whether the frame is above `floor`. On a stack that is not the thread's
// own (or a thread whose stack is unknown), whose size cannot be judged:
// only if no task runs nested on it yet.
[[gnu::always_inline]] inline bool above(std::uintptr_t floor, const StackBounds& b) noexcept {
  const std::uintptr_t sp = stack_pointer();
  if (foreign(sp, b)) [[unlikely]]
    return t_foreign_nesting == 0;
  return sp >= floor;
}

// Own tasks run in a wait only above half the reserve, where the wait may
// throw: what is left is for the wait's own frames and the unwinding of its
// throw. Where it cannot throw (~Group, or while an exception unwinds),
// down to a quarter of the reserve: below that it nests nothing. Either
// floor is below the one where such a wait stops nesting the tasks it
// waits for (stack_allows_nesting), so that it can still settle the ones
// it cancelled there, which are in its own queue.
bool stack_allows_own_help() noexcept {
  const StackBounds& b = this_stack();
  return above(b.own_floor, b) || (!waits_may_throw_for_stack() && above(b.hard_floor, b));
}

// Counts a task run nested in a wait on a foreign stack, for its duration.
class ForeignNesting {
 public:
  ForeignNesting() noexcept : counted_(on_foreign_stack()) {
    if (counted_) ++t_foreign_nesting;
  }
  ForeignNesting(const ForeignNesting&) = delete;
  ForeignNesting& operator=(const ForeignNesting&) = delete;
  ~ForeignNesting() {
    if (counted_) --t_foreign_nesting;
  }

 private:
  bool counted_;
};

}  // namespace

bool on_foreign_stack() noexcept { return foreign(stack_pointer(), this_stack()); }

// Taking a task that is not the caller's own (the shared queue, another
// worker's queue) nests a task of unknown depth on this stack; it is allowed
// while at most a sixteenth of the stack is in use. Own tasks are taken much
// deeper (stack_allows_own_help): their nesting follows the program's
// recursion.
bool stack_allows_help() noexcept {
  const StackBounds& b = this_stack();
  return above(b.help_floor, b);
}

bool waits_may_throw_for_stack() noexcept {
  return t_no_stack_throw == 0 && std::uncaught_exceptions() == 0;
}

// The deeper floor applies only where the wait cannot throw; asked second,
// since std::uncaught_exceptions() is a call into the runtime and most waits
// are far above either floor.
bool stack_allows_nesting() noexcept {
  const StackBounds& b = this_stack();
  return above(b.nest_floor, b) || (!waits_may_throw_for_stack() && above(b.own_floor, b));
}

std::string stack_exhausted_message(std::string_view what) {
  const StackBounds& b = this_stack();
  const std::uintptr_t sp = stack_pointer();
  const std::uintptr_t left = sp > b.low && sp <= b.high ? sp - b.low : 0;
  return "crew: " + std::string(what) + " was not run: the waiting worker had " +
         std::to_string(left / 1024) + " KiB of its " + std::to_string((b.high - b.low) / 1024) +
         " KiB stack left, under the " + std::to_string(b.reserve / 1024) +
         " KiB reserve (nested waits this deep need a larger PoolOptions::stack_size, or a loop)";
}

NoStackThrowScope::NoStackThrowScope() noexcept { ++t_no_stack_throw; }
NoStackThrowScope::~NoStackThrowScope() { --t_no_stack_throw; }

bool InlineRunner::run_pending() { return help_once(/*own=*/true, /*foreign=*/true); }

bool InlineRunner::help_once(bool own, bool foreign) {
  if (c_.state() == PoolState::paused) return false;
  Cell cell;
  Worker* w = t_current.core == &c_ ? t_current.worker : nullptr;
  if (w != nullptr) {
    if (!(own && stack_allows_own_help() && c_.queue_->pop_own(cell, w->pop)) &&
        !(foreign && stack_allows_help() && c_.queue_->pop_foreign(cell, w->pop))) {
      return false;
    }
    w->counts.helped.inc();
  } else {
    if (!foreign || !stack_allows_help() || !c_.queue_->try_pop(cell)) return false;
    helped_.fetch_add(1, std::memory_order_relaxed);
  }
  c_.on_slot_freed();
  const ForeignNesting nesting;
  // A plain cell (no task state) while the pool is not dropping runs here at
  // once, as ShutdownSequence::settle_popped_here's first branch would run
  // it, without the call into shutdown.cpp on this path of every fork; any
  // other cell is settled there.
  if (cell.state() == nullptr && !c_.life_.dropping()) [[likely]] {
    run_cell_here(cell);
  } else {
    c_.rt_->shutdown.settle_popped_here(cell);
  }
  return true;
}

bool InlineRunner::help_until(TaskStateBase* s, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  Clock::duration nap = std::chrono::microseconds(50);
  while (!s->done()) {
    if (!stack_allows_nesting()) {
      // Nothing more nests here (below the reserve; where the wait cannot
      // throw, below half of it). On a stack that is not the thread's own,
      // whose size is unknown, it sleeps on the task (another worker runs
      // it). Else, still queued: it never will run (its cell, wherever it
      // is, settles it as cancelled), and the caller's frames, which it may
      // refer to, can unwind; a wait that cannot throw (~Group, unwinding)
      // returns with it settled. Running elsewhere: sleep on it below.
      if (!on_foreign_stack() && s->leave_queue(TaskStatus::cancelled, Errc::stack_exhausted)) {
        if (!waits_may_throw_for_stack()) return true;
        throw Error(Errc::stack_exhausted, stack_exhausted_message("the task waited for"));
      }
    } else {
      // Own newest tasks first: most often `s` and its siblings are among
      // them.
      if (help_once(/*own=*/true, /*foreign=*/false)) continue;
      // Past its queue deadline: ends expired (whoever pops its cell
      // reports it), never started.
      if (s->queue_deadline_passed() && s->expire()) return true;
      if (s->leave_queue(TaskStatus::running)) {
        c_.disarm_queue_deadline(s);
        const ForeignNesting nesting;
        run_claimed_here(s, /*drop_ref=*/false);  // the cell still holds its reference
        return true;
      }
      if (help_once(/*own=*/false, /*foreign=*/true)) {
        nap = std::chrono::microseconds(50);
        continue;
      }
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
  return t_current.core->inline_runner().help_until(s, deadline) ? 1 : 0;
}

}  // namespace crew::detail

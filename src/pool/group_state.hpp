// src/pool/group_state.hpp (private): detail::GroupState, the state
// behind a crew::Group (include/crew/group.hpp declares its head,
// GroupHead, which the inline submit path reads). src/pool/group.cpp is
// the facade over it and holds its helpers and its allocation.
//
// The group keeps the pool's handle of every task it submitted, in blocks
// linked in submission order: the first kFirstBlock handles live inside the
// group's state (a small fork allocates nothing for them), later blocks
// double in size up to kMaxBlock. Indices grow for the group's life;
// handles below `settled_` have been counted and released.
// Waits and cancel() read handles outside the mutex, as "readers" of a
// stretch [settled_, size_) taken under it: submissions only append beyond
// size_, and handles are released (and blocks freed) only by the last
// reader, after it moved settled_ past them under the mutex. So a thread
// waiting for tasks never holds the mutex that submitters and the failing
// task's cancel need.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "crew/detail/block_cache.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "crew/group.hpp"
#include "crew/log.hpp"
#include "futex.hpp"

namespace crew::detail {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kFirstBlock = 4;
constexpr std::uint64_t kMaxBlock = 256;
// Handles of ended tasks are released by the submitter once this many are
// live (and then once twice as many as were left live), so that a group fed
// for a long time without wait() stays small.
constexpr std::uint64_t kPruneMin = 4096;

// `cap` handles at `slots`: the group state's own array for the first
// block, else in the same allocation as the block.
struct Block {
  std::uint64_t cap = 0;
  Block* next = nullptr;
  Task<void>* slots = nullptr;
};

Block* new_block(std::uint64_t cap);
// Frees a block made by new_block (not the group's first, built in).
void delete_block(Block* b) noexcept;

// Handles [lo, hi), starting in `block`, whose first slot has index `base`.
struct Span {
  Block* block = nullptr;
  std::uint64_t base = 0;
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;

  // Calls fn(handle) in order while it returns true; returns the index it
  // stopped at (hi if it went through).
  template <class Fn>
  std::uint64_t each(Fn&& fn) const {
    Block* b = block;
    std::uint64_t at = base;
    for (std::uint64_t i = lo; i < hi; ++i) {
      if (i - at == b->cap) {
        at += b->cap;
        b = b->next;
      }
      if (!fn(b->slots[i - at])) return i;
    }
    return hi;
  }
};

// Handles cut off by detach_locked, released outside the mutex, and the
// blocks to free after them (from `span.block` up to, not including, `keep`).
struct Detached {
  Span span;
  Block* keep = nullptr;
};

// The group's deadline for GroupOptions::timeout (none for 0).
Clock::time_point deadline_after(std::chrono::nanoseconds timeout);
// The options, checked (throws Error(invalid_options) naming the field).
GroupOptions&& validated(GroupOptions&& o);
// The admission of a handle the pool refused; get() is the only public
// place the reason is kept (Error::admission()).
Admission admission_of(Task<void>& task);

class GroupState final : public GroupHead {
 public:
  // From a small per-thread cache of freed states (group.cpp).
  static void* operator new(std::size_t size);
  static void operator delete(void* p) noexcept;

  GroupState(Pool& pool, GroupOptions opts)
      : GroupHead(pool, opts.timeout.count() == 0 && opts.name.empty()),
        opts_(validated(std::move(opts))),
        deadline_(deadline_after(opts_.timeout)) {}
  GroupState(const GroupState&) = delete;
  GroupState& operator=(const GroupState&) = delete;

  ~GroupState() {
    SpinLockGuard lock(mu_);
    for (Block* b = head_; b != nullptr;) free_block(std::exchange(b, b->next));
  }

  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  // The group drops its reference last but for tasks with handles; a sole
  // holder (count 1) frees without the read-modify-write, as nobody else
  // can take a reference to a state only it holds.
  void release() noexcept {
    if (refs_.load(std::memory_order_acquire) == 1 ||
        refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      delete this;
    }
  }

  Admission prepare(TaskOptions& o, bool is_long) {
    if (cancelled_flag_.load(std::memory_order_acquire)) return refuse(&OutcomeCounts::cancelled);
    if (deadline_ != Clock::time_point::max()) {
      const Clock::time_point now = Clock::now();
      if (now >= deadline_) return refuse(&OutcomeCounts::rejected);
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline_ - now);
      if (o.queue_timeout.count() == 0 || o.queue_timeout > left) o.queue_timeout = left;
      if (is_long) {
        const std::chrono::nanoseconds own =
            o.timeout.count() != 0 ? o.timeout : pool().options().task_timeout;
        o.timeout = own.count() == 0 || own > left ? left : own;
      }
    }
    if (o.name.empty()) o.name = opts_.name;
    return Admission::accepted;
  }

  Admission adopt(Task<void>&& task) {
    const Admission a = admission_of(task);
    bool prune_now = false;
    try {
      {
        SpinLockGuard lock(mu_);
        if (!cancelled_) {
          append_locked(std::move(task));
          prune_now = size_ - settled_ >= prune_at_ && readers_ == 0;
        }
      }
      if (task.valid()) {
        // cancel() ran before this handle was in the list: cancel it here,
        // outside the mutex (a long task's stop callbacks are user code).
        (void)task.cancel();
        SpinLockGuard lock(mu_);
        append_locked(std::move(task));
        return a;
      }
    } catch (...) {
      // Out of memory for the handle list (append_locked leaves the handle
      // with us when it throws): the task was submitted, and wait() could
      // not cover it. It must not outlive the group unseen, so it is
      // cancelled and awaited before submit() throws.
      if (task.valid()) {
        (void)task.cancel();
        try {
          (void)task.wait_until(Clock::time_point::max());
        } catch (...) {  // stack_exhausted: it was queued, and is cancelled
        }
      }
      throw;
    }
    if (prune_now) prune();
    return a;
  }

  void failed(std::exception_ptr e) noexcept {
    bool cancel_now = false;
    {
      SpinLockGuard lock(mu_);
      if (!first_error_) first_error_ = std::move(e);
      cancel_now = opts_.cancel_on_failure && !cancelled_;
    }
    if (cancel_now) cancel();
  }

  // Whether a wait cancelled the group for want of stack since the last
  // call (Group::wait then throws Error(stack_exhausted)). The load first:
  // every wait asks, and an exchange is a locked write to the line the
  // group's tasks count down on.
  bool take_stack_cancel() noexcept {
    return stack_cancel_.load(std::memory_order_relaxed) && stack_cancel_.exchange(false);
  }
  [[nodiscard]] std::string describe() const {
    return opts_.name.empty() ? std::string("a group") : "group '" + opts_.name + "'";
  }

  bool wait_until(Clock::time_point deadline) {
    const bool help = t_running_pool == &pool();
    for (;;) {
      if (!wait_counted(deadline, help)) return false;
      // Only tasks without handles so far (the fork-join shape): done. A
      // handle appended by one of them was appended before its end, which
      // wait_counted has seen.
      if (!has_handles_.load(std::memory_order_acquire)) return true;
      Span r;
      {
        SpinLockGuard lock(mu_);
        if (settled_ == size_) {
          if (pending_of(counted_.load(std::memory_order_acquire)) == 0) return true;
          continue;  // a task submitted more meanwhile
        }
        r = begin_read_locked();
      }
      OutcomeCounts tally;
      // The handles' waits do not throw for want of stack: the span read is
      // open. Below the reserve, wait_counted has cancelled the group, so
      // they have nothing left to nest.
      const NoStackThrowScope no_throw;
      const std::uint64_t upto = r.each([&](const Task<void>& t) {
        if (!await_task(pool(), t, deadline, help) ||
            !await_returned(pool(), t.state(), "group", opts_.name, deadline)) {
          return false;
        }
        tally.add(t.status());
        return true;
      });
      // Every handle has ended, but one of them may have submitted tasks
      // without handles meanwhile: done only if those are settled too, in
      // the same pass.
      if (end_read(r, upto, tally)) {
        if (pending_of(counted_.load(std::memory_order_acquire)) == 0) return true;
        continue;
      }
      if (upto != r.hi) return false;  // the deadline passed
    }
  }

  void cancel() noexcept {
    Span r;
    {
      SpinLockGuard lock(mu_);
      cancelled_ = true;
      cancelled_flag_.store(true, std::memory_order_release);
      if (settled_ == size_) return;
      r = begin_read_locked();
    }
    // Queued tasks first, then stops to the running long ones: a long task
    // stopped first could return and free its worker, which would start a
    // queued sibling before this loop reached it.
    (void)r.each([](Task<void>& t) {
      if (TaskStateBase* st = t.state())
        (void)st->leave_queue(TaskStatus::cancelled, Errc::cancelled);
      return true;
    });
    (void)r.each([](Task<void>& t) {
      (void)t.cancel();
      return true;
    });
    (void)end_read(r, r.lo, OutcomeCounts{});
  }

  // ---- tasks without handles (GroupCell) ----
  // One word counts them: bits 0-30 the pending ones, bit 31 set while a
  // waiter may sleep on the count (kSleeperBit), the high half the ones that
  // succeeded and were not yet folded into counted_counts_. A pending task
  // holds no reference to the state. A success is one compare-exchange on
  // that word (pending - 1, succeeded + 1 at once, so stats() never sees a
  // task both pending and ended, or neither), after which the ender touches
  // nothing of the state: the state cannot be freed before it, as the task
  // is pending until then. The last pending task's end takes that path too
  // unless a waiter set the sleeper bit, since then it must wake it. Every
  // other end (an outcome other than success, a high half due for folding,
  // the last one with the bit set) takes mu_ and drops the count under it;
  // everything that frees the state (the group's destructor, after its wait
  // or its settled() check) takes mu_ or sees it free after it saw no task
  // pending, so it waits for that ender, which touches nothing after.
  void counted_begin() noexcept { counted_.fetch_add(1, std::memory_order_seq_cst); }
  void counted_end(TaskStatus outcome) noexcept {
    if (outcome == TaskStatus::succeeded) {
      std::uint64_t w = counted_.load(std::memory_order_relaxed);
      while ((pending_of(w) > 1 || (w & kSleeperBit) == 0) && (w >> 32) < kFoldAt) {
        if (counted_.compare_exchange_weak(w, w + kOneSucceeded - 1, std::memory_order_acq_rel,
                                           std::memory_order_relaxed)) {
          return;
        }
      }
    }
    SpinLockGuard lock(mu_);
    counted_counts_.add(outcome);
    std::uint64_t w = counted_.load(std::memory_order_relaxed);
    // Folds the high half and drops this task, in one step; the sleeper bit
    // stays while tasks are pending (a waiter may still sleep on them).
    while (!counted_.compare_exchange_weak(
        w, pending_of(w) == 1 ? 0 : (w & (kPendingMask | kSleeperBit)) - 1,
        std::memory_order_seq_cst, std::memory_order_relaxed)) {
    }
    counted_counts_.succeeded += w >> 32;
    // The wake-up reads the waiters after the drop (seq_cst, against
    // wait_counted's announce-then-check), still under the lock: a waiter
    // not seen here announced itself after the drop, so it sees the count
    // at zero and does not sleep.
    if (pending_of(w) == 1 && counted_waiters_.load(std::memory_order_seq_cst) != 0) {
      counted_zero_.fetch_add(1, std::memory_order_seq_cst);
      futex_wake(counted_zero_, INT32_MAX);
    }
  }

  GroupStats stats() const {
    SpinLockGuard lock(mu_);
    GroupStats s;
    // A task without a handle is pending from its begin until its end drops
    // the count under this lock, together with recording its outcome: so
    // pending plus ended is exactly the number submitted.
    const std::uint64_t w = counted_.load(std::memory_order_acquire);
    s.pending = pending_of(w);
    s.outcomes = counts_;
    s.outcomes += counted_counts_;
    s.outcomes.succeeded += w >> 32;
    s.submitted = submitted_ + s.pending + counted_counts_.total() + (w >> 32);
    s.cancelled = cancelled_;
    // Handles at or above settled_ are released only after a reader moves
    // settled_ past them, which needs the mutex held here.
    (void)live_locked().each([&s](const Task<void>& t) {
      const TaskStatus st = t.status();
      if (is_final(st)) {
        s.outcomes.add(st);
      } else {
        ++s.pending;
      }
      return true;
    });
    return s;
  }

  // For the group's destructor, once every task has ended: releases the
  // remaining handles, which would otherwise keep the state alive (each
  // task's state holds a reference to the group's).
  void close() {
    Detached cut;
    {
      SpinLockGuard lock(mu_);
      closing_ = true;
      // A reader still at work (an abandoned task's cancel) releases them.
      if (readers_ != 0 || settled_ == size_) return;
      ++readers_;
      cut = detach_locked(size_);
    }
    release_detached(cut);
    SpinLockGuard lock(mu_);
    --readers_;
  }

  // For the group's destructor, without the lock: true if no task is
  // pending, none ever had a handle, and no thread is inside mu_. The last
  // pending task's end drops the count inside mu_ (counted_end), so once the
  // count reads zero and the lock reads free, that end has left the state.
  // False says nothing: settled() then decides.
  bool quiet() const noexcept {
    return pending_of(counted_.load(std::memory_order_acquire)) == 0 &&
           !has_handles_.load(std::memory_order_acquire) && mu_.is_free();
  }

  // For the group's destructor: true if every task has ended and its handle
  // was released (the usual state after wait()), so there is nothing to
  // cancel, wait for or close.
  bool settled() const {
    SpinLockGuard lock(mu_);
    return settled_ == size_ && readers_ == 0 &&
           pending_of(counted_.load(std::memory_order_acquire)) == 0;
  }

  std::exception_ptr first_exception() const {
    SpinLockGuard lock(mu_);
    return first_error_;
  }

  Clock::time_point deadline() const noexcept { return deadline_; }

 private:
  Admission refuse(std::uint64_t OutcomeCounts::*outcome) {
    SpinLockGuard lock(mu_);
    ++submitted_;
    ++(counts_.*outcome);
    return Admission::closed;
  }

  void append_locked(Task<void>&& task) CREW_REQUIRES(mu_) {
    if (tail_ == nullptr) {
      has_handles_.store(true, std::memory_order_release);
      head_ = tail_ = &first_;
      head_base_ = tail_base_ = size_;
    } else if (size_ - tail_base_ == tail_->cap) {
      tail_->next = new_block(std::min(kMaxBlock, 2 * std::max(tail_->cap, kFirstBlock)));
      tail_base_ += tail_->cap;
      tail_ = tail_->next;
    }
    tail_->slots[size_ - tail_base_] = std::move(task);
    ++size_;
    ++submitted_;
  }

  Span live_locked() const CREW_REQUIRES(mu_) { return {head_, head_base_, settled_, size_}; }

  Span begin_read_locked() CREW_REQUIRES(mu_) {
    ++readers_;
    return live_locked();
  }

  // Ends a read of `r` whose handles [r.lo, upto) have ended (`tally` counts
  // them). The last reader counts them and releases them. Returns true if
  // every task submitted so far has ended.
  bool end_read(const Span& r, std::uint64_t upto, const OutcomeCounts& tally) {
    Detached cut;
    bool all_done = false;
    {
      SpinLockGuard lock(mu_);
      all_done = upto == r.hi && size_ == r.hi;
      // Closing: every task has ended, release them all.
      const std::uint64_t cut_to = closing_ ? size_ : upto;
      if (readers_ != 1 || cut_to == settled_) {
        --readers_;
        return all_done;
      }
      // Only the last reader gets here, so settled_ is still r.lo.
      counts_ += tally;
      cut = detach_locked(cut_to);
      // Still a reader while it releases, so that no other thread frees
      // the block it is working in.
    }
    release_detached(cut);
    SpinLockGuard lock(mu_);
    --readers_;
    return all_done;
  }

  // Moves settled_ to `upto` and unlinks the blocks wholly below it (never
  // the tail, which submissions append to).
  Detached detach_locked(std::uint64_t upto) CREW_REQUIRES(mu_) {
    Detached d{live_locked(), nullptr};
    d.span.hi = upto;
    settled_ = upto;
    while (head_ != tail_ && head_base_ + head_->cap <= upto) {
      head_base_ += head_->cap;
      head_ = head_->next;
    }
    d.keep = head_;
    return d;
  }

  void release_detached(const Detached& d) noexcept {
    (void)d.span.each([](Task<void>& t) {
      t = Task<void>();
      return true;
    });
    for (Block* b = d.span.block; b != d.keep;) free_block(std::exchange(b, b->next));
  }

  void free_block(Block* b) noexcept {
    if (b != &first_) delete_block(b);
  }

  // Releases the handles of ended tasks at the front of the list.
  void prune() {
    Span r;
    {
      SpinLockGuard lock(mu_);
      if (readers_ != 0) return;
      r = begin_read_locked();
    }
    OutcomeCounts tally;
    const std::uint64_t upto = r.each([&tally](const Task<void>& t) {
      if (!t.ready() || t.state()->callable_live()) return false;
      tally.add(t.status());
      return true;
    });
    (void)end_read(r, upto, tally);
    SpinLockGuard lock(mu_);
    prune_at_ = std::max(kPruneMin, 2 * (size_ - settled_));
  }

  // Until the tasks without handles have ended: on a worker of the pool (or
  // a thread running one of its tasks, `help`) it runs queued tasks of the
  // pool meanwhile, own ones first; otherwise it sleeps on the count.
  bool wait_counted(Clock::time_point deadline, bool help) {
    const bool helps = help || on_worker_of_pool();  // runs the pool's tasks while it waits
    // Too little stack left to nest the group's tasks here: they are
    // cancelled (Group::wait throws once they have settled, where it may
    // throw). The frame stays where it is for the whole wait, so this is
    // asked once. On a stack not the thread's own, it sleeps instead.
    const bool short_of_stack = helps && !stack_allows_nesting() && !on_foreign_stack();
    Clock::duration nap = std::chrono::microseconds(50);
    for (;;) {
      const std::uint32_t zero = counted_zero_.load(std::memory_order_acquire);
      if (pending_of(counted_.load(std::memory_order_acquire)) == 0) return true;
      if (short_of_stack && !stack_cancel_.exchange(true)) cancel();
      if (helps && PoolAccess::core(pool()).inline_runner().run_pending()) {
        nap = std::chrono::microseconds(50);
        continue;
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return false;
      Clock::time_point until = deadline;
      if (helps) {
        until = deadline - now > nap ? now + nap : deadline;
        nap = std::min<Clock::duration>(nap * 2, std::chrono::milliseconds(1));
      }
      // The last end bumps counted_zero_ after its drop: announced here
      // first (and the sleeper bit set, which sends the last end through
      // mu_), the count seen non-zero after, this sleeps only until then.
      counted_waiters_.fetch_add(1, std::memory_order_seq_cst);
      if (mark_sleeper()) futex_wait(counted_zero_, zero, until);
      counted_waiters_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  // Sets the sleeper bit unless no task is pending; false if none is.
  bool mark_sleeper() noexcept {
    std::uint64_t w = counted_.load(std::memory_order_seq_cst);
    while (pending_of(w) != 0) {
      if ((w & kSleeperBit) != 0 ||
          counted_.compare_exchange_weak(w, w | kSleeperBit, std::memory_order_seq_cst,
                                         std::memory_order_seq_cst)) {
        return true;
      }
    }
    return false;
  }
  bool on_worker_of_pool() const noexcept { return t_current.core == &PoolAccess::core(pool()); }

  // 2^31 - 1 tasks pending at once at most.
  static constexpr std::uint64_t kPendingMask = 0x7fff'ffffULL;
  static constexpr std::uint64_t kSleeperBit = 0x8000'0000ULL;
  static constexpr std::uint64_t kOneSucceeded = std::uint64_t{1} << 32;
  // Low enough that tests reach it, high enough to cost nothing per task.
  static constexpr std::uint64_t kFoldAt = std::uint64_t{1} << 20;
  static std::uint32_t pending_of(std::uint64_t w) noexcept {
    return static_cast<std::uint32_t>(w & kPendingMask);
  }

  std::atomic<std::uint32_t> refs_{1};
  std::atomic<std::uint64_t> counted_{0};  // see counted_begin
  // Bumped when the pending count falls to zero while a waiter is announced.
  std::atomic<std::uint32_t> counted_zero_{0};
  std::atomic<std::uint32_t> counted_waiters_{0};
  std::atomic<bool> stack_cancel_{false};  // a wait cancelled the group for want of stack
  const GroupOptions opts_;
  const Clock::time_point deadline_;
  std::atomic<bool> has_handles_{false};  // a handle was ever appended (quiet())

  // Held for a few instructions at a time (no allocation but a new block).
  mutable SpinLock mu_;
  Task<void> first_slots_[kFirstBlock];
  Block first_{kFirstBlock, nullptr, first_slots_};
  Block* head_ CREW_GUARDED_BY(mu_) = nullptr;  // holds index settled_ (or is the tail)
  Block* tail_ CREW_GUARDED_BY(mu_) = nullptr;  // holds index size_ - 1
  std::uint64_t head_base_ CREW_GUARDED_BY(mu_) = 0;
  std::uint64_t tail_base_ CREW_GUARDED_BY(mu_) = 0;
  std::uint64_t settled_ CREW_GUARDED_BY(mu_) = 0;
  std::uint64_t size_ CREW_GUARDED_BY(mu_) = 0;
  int readers_ CREW_GUARDED_BY(mu_) = 0;
  std::uint64_t prune_at_ CREW_GUARDED_BY(mu_) = kPruneMin;
  std::uint64_t submitted_ CREW_GUARDED_BY(mu_) = 0;
  OutcomeCounts counts_ CREW_GUARDED_BY(mu_);          // settled handles and refusals
  OutcomeCounts counted_counts_ CREW_GUARDED_BY(mu_);  // ended tasks without handles
  std::exception_ptr first_error_ CREW_GUARDED_BY(mu_);
  bool cancelled_ CREW_GUARDED_BY(mu_) = false;
  bool closing_ CREW_GUARDED_BY(mu_) = false;
};

}  // namespace crew::detail

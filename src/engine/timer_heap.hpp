// src/engine/timer_heap.hpp (private): a pool's deadlines that live on task
// states: queue deadlines (a task not started by then expires) and the
// execution deadlines of long tasks that run outside a worker's top level.
// Each armed deadline is an (deadline, state) entry holding one reference
// to its state; Extras::heap_index says where the entry is. Every task with
// a deadline has Extras (TaskStateBase::Extras).
//
// Two places hold entries:
//   the lane  a ring in arming order, for deadlines no earlier than the
//             last one armed there. Tasks of one pool mostly carry the same
//             queue timeout and are armed as they are submitted, so their
//             deadlines arrive in order: arming appends, and disarming
//             (the task started, mostly the oldest one first) clears the
//             entry and drops cleared entries off the front. Both O(1), and
//             neither touches another task's state.
//   the heap  a binary min-heap for the rest (a shorter timeout after a
//             longer one, or two submitters racing), O(log n).
// The next deadline is the earlier of the lane's front and the heap's top.
// A cleared lane entry holds no reference; cleared entries behind a live
// front are compacted away once they outnumber the live ones (and
// kLaneSlack), so the lane stays within twice the armed tasks.
//
// Who touches what: everything is under the timer lock.
//   push   a submitter with a queue deadline; a thread that starts a
//          foreign long run with a deadline
//   erase  whoever takes the task out of the queue (a worker, a sweep),
//          or ends the foreign run
//   pop_due, take_all  the supervisor (take_all once, after it stopped)
// A state's timer fields (Extras::heap_index, TaskStateBase::timer_exec)
// are written only under the lock.
//
// The lock is a SpinLock, not a Mutex: submitters arm and workers disarm a
// task's queue deadline at every submission and start, so the timers are
// contended exactly while a pool is busy, and each section is short. With
// the deadline kept in the heap's entry (the comparisons read no state) and
// the spin lock, crew_bench's queue_deadline took 390-489 ns per task
// against 549-622 before (4 alternated runs of `crew_bench --impl crew
// --workload short_detached,queue_deadline --rounds 3`; short_detached 35
// ns in both); docs/design/architecture.md ("Deadlines: one timer per pool") has what
// the lane changed.
#pragma once

#include <cstdint>
#include <vector>

#include "crew/detail/spin_lock.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

class TimerHeap {
 public:
  // No deadline armed.
  static constexpr std::int64_t kNever = INT64_MAX;
  // Cleared lane entries tolerated behind a live front beyond as many as
  // there are live ones (see above).
  static constexpr std::size_t kLaneSlack = 1024;
  // Extras::heap_index of an entry in the lane: this bit and its sequence
  // number (TaskStateBase::kNotInHeap, all ones, is neither place).
  static constexpr std::size_t kInLane = std::size_t{1} << 62;
  // One armed timer: the deadline is kept beside the state, so that the
  // heap's comparisons read no state.
  struct Entry {
    std::int64_t at_ns;
    TaskStateBase* state;
  };

  explicit TimerHeap(std::size_t lane_slack = kLaneSlack) noexcept : lane_slack_(lane_slack) {}
  TimerHeap(const TimerHeap&) = delete;
  TimerHeap& operator=(const TimerHeap&) = delete;

  // Arms `s` (the caller has added the heap's reference) at steady_clock
  // `at_ns`; `exec`: an execution deadline (stop the run), else a queue
  // deadline (expire the task). True if it is now the earliest. May throw
  // (out of memory), arming nothing.
  bool push(TaskStateBase* s, std::int64_t at_ns, bool exec);
  // Disarms `s`; true if it was armed (the caller then drops the heap's
  // reference, outside any lock: it may run a destructor).
  bool erase(TaskStateBase* s) noexcept;
  // A fired timer: the state (with the heap's reference) and what it was
  // armed for, read under the heap's lock (a foreign run may re-arm the
  // same state as soon as the lock is released).
  struct Due {
    TaskStateBase* state;
    bool exec;
  };
  // Moves the states due at `now` into `due` and returns the next
  // deadline, kNever if none. May throw (out of memory for `due`), leaving
  // what it did not move armed.
  std::int64_t pop_due(std::int64_t now, std::vector<Due>& due);
  // Every armed entry, in no order (the two places' own).
  struct Armed {
    std::vector<Entry> heap;
    std::vector<Entry> lane;
  };
  // Disarms everything and hands over the references.
  Armed take_all() noexcept;

  // Entries in the lane, cleared ones included (tests).
  [[nodiscard]] std::size_t lane_size_for_testing() noexcept {
    SpinLockGuard lock(mu_);
    return lane_count_;
  }

 private:
  // The lane's entry `i` places from its front.
  Entry& lane_at(std::size_t i) noexcept CREW_REQUIRES(mu_) {
    return lane_[(lane_head_ + i) & (lane_.size() - 1)];
  }
  // Rotates the ring so that the lane's front is its first slot.
  void lane_unwrap() noexcept CREW_REQUIRES(mu_);
  // Appends to the lane (at_ns no earlier than its last entry). May throw
  // (out of memory for a bigger ring), appending nothing.
  void lane_push(Entry e) CREW_REQUIRES(mu_);
  // Drops the front entry, live (its reference is the caller's), then the
  // cleared entries behind it.
  void lane_pop_front() noexcept CREW_REQUIRES(mu_);
  // Removes the cleared entries behind the live front.
  void lane_compact() noexcept CREW_REQUIRES(mu_);

  const std::size_t lane_slack_;
  SpinLock mu_;
  std::vector<Entry> heap_ CREW_GUARDED_BY(mu_);
  // A ring of a power-of-two size (or empty): lane_count_ entries from
  // lane_head_, the front one live; entry i's state (if live) has
  // heap_index kInLane | (lane_front_seq_ + i).
  std::vector<Entry> lane_ CREW_GUARDED_BY(mu_);
  std::size_t lane_head_ CREW_GUARDED_BY(mu_) = 0;
  std::size_t lane_count_ CREW_GUARDED_BY(mu_) = 0;
  std::size_t lane_cleared_ CREW_GUARDED_BY(mu_) = 0;
  std::size_t lane_front_seq_ CREW_GUARDED_BY(mu_) = 0;
};

}  // namespace crew::detail

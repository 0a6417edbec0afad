// src/timer_heap.hpp (private): a pool's deadlines that live on task
// states: queue deadlines (a task not started by then expires) and the
// execution deadlines of long tasks that run outside a worker's top level.
// A binary min-heap of (deadline, state) entries, each holding one
// reference to its state; Extras::heap_index is the entry's slot. Every
// task with a deadline has Extras (TaskStateBase::Extras).
//
// Who touches what: everything is under the heap's own lock.
//   push   a submitter with a queue deadline; a thread that starts a
//          foreign long run with a deadline
//   erase  whoever takes the task out of the queue (a worker, a sweep),
//          or ends the foreign run
//   pop_due, take_all  the supervisor (take_all once, after it stopped)
// A state's timer fields (Extras::heap_index, TaskStateBase::timer_exec)
// are written only under the lock.
//
// The lock is a SpinLock, not a Mutex: submitters arm and workers disarm a
// task's queue deadline at every submission and start, so the heap is
// contended exactly while a pool is busy, and each section is one sift.
// With the deadline kept in the entry (the comparisons read no state) and
// the spin lock, crew_bench's queue_deadline took 390-489 ns per task
// against 549-622 before (4 alternated runs of `crew_bench --impl crew
// --workload short_detached,queue_deadline --rounds 3`; short_detached 35
// ns in both).
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
  // One armed timer: the deadline is kept beside the state, so that the
  // heap's comparisons read no state.
  struct Entry {
    std::int64_t at_ns;
    TaskStateBase* state;
  };

  TimerHeap() = default;
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
  // Moves the states due at `now` into `due` (with their references) and
  // returns the next deadline, kNever if none. May throw (out of memory
  // for `due`), leaving what it did not move armed.
  std::int64_t pop_due(std::int64_t now, std::vector<TaskStateBase*>& due);
  // Disarms everything and hands over the references.
  std::vector<Entry> take_all() noexcept;

 private:
  SpinLock mu_;
  std::vector<Entry> heap_ CREW_GUARDED_BY(mu_);
};

}  // namespace crew::detail

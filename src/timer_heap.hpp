// src/timer_heap.hpp (private): a pool's deadlines that live on task
// states: queue deadlines (a task not started by then expires) and the
// execution deadlines of long tasks that run outside a worker's top level.
// A binary min-heap by the states' Extras::timer_at_ns, each entry holding
// one reference to its state; Extras::heap_index is its slot. Every task
// with a deadline has Extras (TaskStateBase::Extras).
//
// Who touches what: everything is under the heap's own mutex.
//   push   a submitter with a queue deadline; a thread that starts a
//          foreign long run with a deadline
//   erase  whoever takes the task out of the queue (a worker, a sweep),
//          or ends the foreign run
//   pop_due, take_all  the supervisor (take_all once, after it stopped)
// A state's timer fields (Extras::timer_at_ns and heap_index,
// TaskStateBase::timer_exec) are written only under the mutex.
#pragma once

#include <cstdint>
#include <vector>

#include "crew/detail/mutex.hpp"
#include "crew/detail/task_state.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

class TimerHeap {
 public:
  // No deadline armed.
  static constexpr std::int64_t kNever = INT64_MAX;

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
  std::vector<TaskStateBase*> take_all() noexcept;

 private:
  Mutex mu_;
  std::vector<TaskStateBase*> heap_ CREW_GUARDED_BY(mu_);
};

}  // namespace crew::detail

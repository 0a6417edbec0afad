// crew/detail/submit_api.hpp: the submission calls of crew::Pool and
// crew::ShardedPool (post, try_post, submit, try_submit, submit_wait),
// written once.
//
// SubmitApi<Derived> is a base class (CRTP) that gives Derived these public
// calls. Derived supplies one private hook, a friend of SubmitApi<Derived>:
//
//   template <bool kHandle, bool kMayBlock, class F>
//   decltype(auto) enqueue(F&& f, TaskOptions&& opts);
//
// which returns an Admission (kHandle false) or a Task<R> handle (kHandle
// true). Both choices are template arguments, so a call costs what a direct
// call of the hook costs: everything here is inlined.
#pragma once

#include <type_traits>
#include <utility>

#include "crew/error.hpp"
#include "crew/task.hpp"

namespace crew::detail {

template <class Derived>
class SubmitApi {
 public:
  // Fire-and-forget. If the queue is full and the overflow policy is block,
  // waits until the task's priority level has drained to half its capacity
  // or a shutdown starts (never when called from a task of this pool: the
  // task then runs inline). With a TaskOptions::queue_timeout it waits no
  // longer than that deadline (within a millisecond): the task then ends
  // as one that waited that long in the queue would, rejected with
  // Errc::expired (counted in outcomes.rejected), without being queued,
  // and the call returns accepted. Returns accepted, or why the task was refused; a
  // refused task is counted as rejected.
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  [[nodiscard]] Admission post(F&& f) {
    return self().template enqueue<false, true>(std::forward<F>(f), TaskOptions{});
  }
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  [[nodiscard]] Admission post(F&& f, TaskOptions opts) {
    return self().template enqueue<false, true>(std::forward<F>(f), std::move(opts));
  }
  // Never blocks: a full queue gives Admission::full (or runs the task on the
  // caller under Overflow::caller_runs).
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  [[nodiscard]] Admission try_post(F&& f, TaskOptions opts = {}) {
    return self().template enqueue<false, false>(std::forward<F>(f), std::move(opts));
  }

  // Returns a handle; blocks as post() does. A refused task's handle is
  // already `rejected`, with Error::admission() saying why.
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  Task<task_result_t<std::decay_t<F>>> submit(F&& f, TaskOptions opts = {}) {
    return self().template enqueue<true, true>(std::forward<F>(f), std::move(opts));
  }
  // Never blocks, as try_post().
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  Task<task_result_t<std::decay_t<F>>> try_submit(F&& f, TaskOptions opts = {}) {
    return self().template enqueue<true, false>(std::forward<F>(f), std::move(opts));
  }

  // Submits and waits: returns the value or throws what Task::get() throws.
  // Blocks until the task has ended; called from a worker of the pool (of the
  // task's shard, on a ShardedPool) it runs queued tasks meanwhile
  // (Task::wait), so it never deadlocks.
  template <class F>
    requires(is_task_v<std::decay_t<F>>)
  task_result_t<std::decay_t<F>> submit_wait(F&& f, TaskOptions opts = {}) {
    return submit(std::forward<F>(f), std::move(opts)).get();
  }

 protected:
  SubmitApi() = default;
  ~SubmitApi() = default;
  SubmitApi(const SubmitApi&) = default;
  SubmitApi& operator=(const SubmitApi&) = default;

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

}  // namespace crew::detail

// crew/detail/task_events.hpp: a pool's task events, told to its observers
// (src/engine/observer_hub.hpp) by code that decides a task's steps outside
// a worker's run: the submission path's out-of-line part (src/engine), and
// coroutine tasks (src/coro), whose steps, ends and refusals the engine
// does not see. Not installed: no installed header includes it.
//
// Threads: any; each call runs the observers' user code on the calling
// thread until it returns, so none is made under an engine lock.
#pragma once

#include <cstdint>

#include "crew/error.hpp"
#include "crew/task_status.hpp"

namespace crew::detail {

class PoolCore;
class TaskStateBase;

namespace task_events {

// A task was queued: task state `s`, or a plain task if null. Called only
// when an observer wants Observer::task_enqueued.
void enqueued(const PoolCore& core, const TaskStateBase* s, bool is_long) noexcept;
// A submission was refused (`why`): `s`, or a plain task if null. Called
// only when an observer wants Observer::task_rejected.
void refused(const PoolCore& core, const TaskStateBase* s, bool is_long, Admission why) noexcept;
// A coroutine task's first step started; it ended after it started; it
// ended unstarted with `outcome` and `why`. Each tells the observers only
// if one wants that event.
void started(const PoolCore& core, const TaskStateBase* s, std::int64_t enqueued_ns,
             std::int64_t start_ns) noexcept;
void finished(const PoolCore& core, const TaskStateBase* s, TaskStatus outcome,
              std::int64_t enqueued_ns, std::int64_t start_ns, std::int64_t end_ns) noexcept;
void unrun(const PoolCore& core, const TaskStateBase* s, TaskStatus outcome, Errc why) noexcept;

}  // namespace task_events
}  // namespace crew::detail

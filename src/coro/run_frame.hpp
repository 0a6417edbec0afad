// src/coro/run_frame.hpp: running a frame of a coroutine task as a step.
#pragma once

#include <coroutine>

#include "crew/detail/coro_task.hpp"

namespace crew::detail {

// Resumes frame `h` of task `t` on this thread, with current_coro_task()
// returning `t` until the frame suspends or ends (then what it was).
void run_frame(CoroTaskBase* t, std::coroutine_handle<> h) noexcept;

}  // namespace crew::detail

// src/app/app_controller.hpp (private): the lifecycle controller, the thread in
// Application::run(). See src/app/app_controller.cpp.
#pragma once

#include <functional>
#include <memory>

#include "app_core.hpp"

namespace crew::detail {

// Runs the whole lifecycle (init, running, halting, shutdown, off) on the
// calling thread, starting main on a thread of its own; returns when the
// application is off. Throws only what allocation throws; the threads it
// started are then let go (they own the core).
ExitCode run_lifecycle(const std::shared_ptr<AppCore>& core,
                       std::function<void(const Context&)> main);

}  // namespace crew::detail

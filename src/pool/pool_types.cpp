// The names of the pool's enums (crew/pool_types.hpp), as logs, metrics
// labels and reports spell them.
#include "crew/pool_types.hpp"

#include <string_view>

namespace crew {

std::string_view to_string(Overflow v) noexcept {
  switch (v) {
    case Overflow::block:
      return "block";
    case Overflow::reject:
      return "reject";
    case Overflow::caller_runs:
      return "caller_runs";
  }
  return "unknown";
}

std::string_view to_string(ShutdownMode v) noexcept {
  switch (v) {
    case ShutdownMode::drain:
      return "drain";
    case ShutdownMode::soft:
      return "soft";
    case ShutdownMode::hard:
      return "hard";
  }
  return "unknown";
}

std::string_view to_string(PoolState v) noexcept {
  switch (v) {
    case PoolState::created:
      return "created";
    case PoolState::running:
      return "running";
    case PoolState::paused:
      return "paused";
    case PoolState::stopping:
      return "stopping";
    case PoolState::stopped:
      return "stopped";
    case PoolState::stopped_timeout:
      return "stopped_timeout";
  }
  return "unknown";
}

std::string_view to_string(WorkerState v) noexcept {
  switch (v) {
    case WorkerState::starting:
      return "starting";
    case WorkerState::idle:
      return "idle";
    case WorkerState::busy:
      return "busy";
    case WorkerState::stopping:
      return "stopping";
    case WorkerState::stopped:
      return "stopped";
    case WorkerState::abandoned:
      return "abandoned";
  }
  return "unknown";
}

std::string_view to_string(WorkerStop v) noexcept {
  switch (v) {
    case WorkerStop::graceful:
      return "graceful";
    case WorkerStop::hard:
      return "hard";
  }
  return "unknown";
}

std::string_view to_string(WorkerPolicy v) noexcept {
  switch (v) {
    case WorkerPolicy::normal:
      return "normal";
    case WorkerPolicy::batch:
      return "batch";
  }
  return "unknown";
}

std::string_view to_string(WorkerStopReason v) noexcept {
  switch (v) {
    case WorkerStopReason::none:
      return "none";
    case WorkerStopReason::idle_expired:
      return "idle_expired";
    case WorkerStopReason::resized:
      return "resized";
    case WorkerStopReason::stop_worker:
      return "stop_worker";
    case WorkerStopReason::shutdown:
      return "shutdown";
    case WorkerStopReason::root_token:
      return "root_token";
    case WorkerStopReason::start_hook_failed:
      return "start_hook_failed";
    case WorkerStopReason::written_off:
      return "written_off";
  }
  return "unknown";
}

}  // namespace crew

// Batch results and the sizing of parallel loops (the rest of batch.hpp is
// templates).
#include "crew/batch.hpp"

#include <limits>
#include <string>

namespace crew::detail {

void OutcomeBase::check() const {
  switch (status) {
    case TaskStatus::succeeded:
      return;
    case TaskStatus::failed:
      if (error) std::rethrow_exception(error);
      break;
    default:
      break;
  }
  const std::string who =
      id == 0 ? "batch task (never submitted)" : "batch task #" + std::to_string(id);
  throw Error(reason, who + ": " + std::string(to_string(reason)));
}

std::chrono::steady_clock::time_point batch_deadline(std::chrono::nanoseconds timeout) {
  using Clock = std::chrono::steady_clock;
  if (timeout.count() <= 0) return Clock::time_point::max();
  return detail::saturating_deadline(Clock::now(), timeout);
}

void count_outcome(OutcomeCounts& counts, TaskStatus status) noexcept {
  switch (status) {
    case TaskStatus::succeeded:
      ++counts.succeeded;
      break;
    case TaskStatus::failed:
      ++counts.failed;
      break;
    case TaskStatus::cancelled:
      ++counts.cancelled;
      break;
    case TaskStatus::timed_out:
      ++counts.timed_out;
      break;
    case TaskStatus::rejected:
      ++counts.rejected;
      break;
    case TaskStatus::queued:
    case TaskStatus::running:
      break;
  }
}

std::size_t loop_threads(const Pool& pool, const ParallelOptions& o) noexcept {
  const std::size_t hardware = std::max<std::size_t>(1, std::thread::hardware_concurrency());
  const std::size_t wanted = o.max_threads != 0 ? o.max_threads : hardware;
  // The pool's own default for max_workers (0) is 2 x hardware threads.
  const std::size_t workers =
      pool.options().max_workers != 0 ? pool.options().max_workers : 2 * hardware;
  return std::max<std::size_t>(1, std::min(wanted, workers + 1));
}

void check_priority(const Pool& pool, const ParallelOptions& o) {
  if (o.priority >= pool.options().priority_levels) {
    throw Error(Errc::invalid_options,
                "crew::ParallelOptions.priority: " + std::to_string(o.priority) +
                    " is not below the pool's priority_levels (" +
                    std::to_string(pool.options().priority_levels) + ")");
  }
}

std::size_t loop_blocks(std::size_t n, std::size_t threads, const ParallelOptions& o) noexcept {
  constexpr std::size_t kPerThread = 16;
  // The pending-block count is a 32-bit futex word.
  constexpr std::size_t kMax = std::numeric_limits<std::uint32_t>::max();
  std::size_t blocks = 0;
  if (o.blocks != 0) {
    blocks = o.blocks;
  } else {
    const std::size_t grain = std::max<std::size_t>(1, o.grain);
    blocks = std::min(threads * kPerThread, n / grain + (n % grain != 0 ? 1 : 0));
  }
  return std::clamp<std::size_t>(blocks, 1, std::min(n, kMax));
}

}  // namespace crew::detail

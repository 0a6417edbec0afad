// The sizing of parallel loops: threads, blocks, and the helpers' priority
// (the loop itself is templates in crew/parallel_for.hpp).
#include "crew/parallel_for.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "crew/usable_cpus.hpp"

namespace crew::detail {

std::size_t loop_threads(const Pool& pool, const ParallelOptions& o) noexcept {
  const std::size_t cpus = usable_cpus();
  const std::size_t wanted = o.max_threads != 0 ? o.max_threads : cpus;
  // The pool's own default for max_workers (0) is 2 x usable CPUs.
  const std::size_t workers =
      pool.options().max_workers != 0 ? pool.options().max_workers : 2 * cpus;
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

// src/engine/pool_options.hpp (private): option resolution for a new pool.
#pragma once

#include <cstddef>

#include "crew/pool_types.hpp"

namespace crew::detail {

// `o` with its defaults filled in (max_workers, queue_capacity and
// queue_shards from usable_cpus(), the default logger). Throws
// Error(invalid_options) naming the first field out of range.
PoolOptions resolved(PoolOptions o);
// The max_workers of Pool::resize(max_workers): 0 is the default (twice the
// usable CPUs). Throws Error(invalid_options) above the limit or below
// `min_workers`.
std::size_t resolved_resize(std::size_t max_workers, std::size_t min_workers);

}  // namespace crew::detail

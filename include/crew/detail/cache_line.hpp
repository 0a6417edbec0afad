// crew/detail/cache_line.hpp: the cache line size crew pads its shared
// atomics to, so that fields written by different threads do not share a
// line.
#pragma once

#include <cstddef>

namespace crew::detail {

inline constexpr std::size_t kCacheLine = 64;

}  // namespace crew::detail

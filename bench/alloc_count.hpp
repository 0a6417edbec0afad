// bench/alloc_count.hpp: process-wide allocation counter for crew_bench.
//
// alloc_count.cpp replaces malloc/calloc/realloc (and the aligned C
// allocators) plus every global operator new/delete. Each allocation bumps a
// per-thread-slot counter; the C++ operators allocate through the counted C
// functions, so every allocation is counted exactly once whichever entry
// point it used. Frees are not counted.
#pragma once

#include <cstdint>

namespace bench {

// Allocations made by all threads since the process started. Take the
// difference of two reads to count a region; concurrent allocations are
// included if they happened before the second read.
[[nodiscard]] std::uint64_t allocations() noexcept;

}  // namespace bench

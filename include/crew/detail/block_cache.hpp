// crew/detail/block_cache.hpp: small blocks from a per-thread cache of freed
// ones (src/base/block_cache.cpp), for task states and boxed callables.
//
// Each thread touches only its own cache. A block may be freed on another
// thread than the one that allocated it; it then joins the freeing thread's
// cache. A cache keeps at most 64 blocks of a size and about 64 KiB in all.
// A full cache hands 32 blocks of the size to a process-wide depot (up to
// 1,024 blocks a size, under a spin lock), from which an empty cache takes
// 32 before it asks the heap: the way back for blocks that one thread
// allocates and others free (a submitting thread's task states). Past those
// bounds blocks go back to the heap, and a thread's cache all of it when
// the thread exits. Blocks of more than kMaxCachedBlock bytes always come
// from the heap, and so do all of them under AddressSanitizer (so that a
// use after free is caught).
#pragma once

#include <cstddef>

namespace crew::detail {

inline constexpr std::size_t kMaxCachedBlock = 512;

// Whether freed blocks are kept at all: not under AddressSanitizer, which
// must see every free to catch a use after it. (Also read by the group
// states' own cache, src/pool/group.cpp, and by the tests.)
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kBlockCacheOn = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kBlockCacheOn = false;
#else
inline constexpr bool kBlockCacheOn = true;
#endif
#else
inline constexpr bool kBlockCacheOn = true;
#endif

// A block of at least `size` bytes, aligned for any fundamental type (16
// bytes); throws std::bad_alloc like operator new.
void* cached_alloc(std::size_t size);
// Frees a block of cached_alloc(size), on any thread.
void cached_free(void* p, std::size_t size) noexcept;

}  // namespace crew::detail

// A per-thread cache of freed small blocks (crew/detail/block_cache.hpp):
// task states (TaskStateBase's operator new and delete) and callables too
// large for a cell (Cell::emplace).
//
// Why: a fork-join step allocates one state per child and frees it on the
// parent's thread after get(); a node with more children than glibc's
// per-thread cache keeps (7 blocks a size) sends the rest through the
// arena's locked free path. perf on skynet(6) with Task handles put malloc
// and free at about a fifth of all cycles.
//
// Who touches what: each thread only its own cache (thread_local), so no
// locks. A block may be allocated on one thread and freed on another; it
// then joins the freeing thread's cache, or goes back to the heap when that
// cache holds kCap blocks of its size or kMaxBytes in all: no cache grows
// beyond 64 KiB, whatever moves between threads. A thread's cache is
// returned to the heap when the thread exits; a block freed after that (by
// another thread_local's destructor) goes straight to the heap.
//
// Under AddressSanitizer every block comes from and returns to the heap, so
// that a use after free of a task state is still caught.
#include "crew/detail/block_cache.hpp"

#include <cstddef>
#include <cstdint>
#include <new>

#include "crew/detail/task_state.hpp"

namespace crew::detail {
namespace {

// Block sizes are multiples of malloc's own granule, so that a block that
// comes from the heap is the size the heap would have given anyway.
constexpr std::size_t kGrain = 16;
constexpr std::size_t kClasses = kMaxCachedBlock / kGrain;
constexpr std::uint32_t kCap = 64;  // blocks kept per size, per thread
// And at most this many bytes in all sizes together, per thread.
constexpr std::size_t kMaxBytes = 64 * 1024;

constexpr std::size_t class_of(std::size_t size) noexcept {
  return (size + kGrain - 1) / kGrain - 1;
}
constexpr std::size_t block_size(std::size_t cls) noexcept { return (cls + 1) * kGrain; }

struct FreeBlock {
  FreeBlock* next;
};

struct ThreadCache {
  FreeBlock* head[kClasses]{};
  std::uint32_t count[kClasses]{};
  std::size_t bytes = 0;  // in all sizes

  ~ThreadCache();
};

// Set once this thread's cache has been destroyed (thread exit).
constinit thread_local bool t_cache_gone = false;
constinit thread_local ThreadCache t_cache{};

ThreadCache::~ThreadCache() {
  t_cache_gone = true;
  for (std::size_t c = 0; c < kClasses; ++c) {
    while (FreeBlock* b = head[c]) {
      head[c] = b->next;
      ::operator delete(b);
    }
  }
}

}  // namespace

void* cached_alloc(std::size_t size) {
  const std::size_t cls = class_of(size);
  if (cls >= kClasses) return ::operator new(size);
  if (kBlockCacheOn && !t_cache_gone) {
    ThreadCache& cache = t_cache;
    if (FreeBlock* b = cache.head[cls]) {
      cache.head[cls] = b->next;
      --cache.count[cls];
      cache.bytes -= block_size(cls);
      return b;
    }
  }
  return ::operator new(block_size(cls));
}

void cached_free(void* p, std::size_t size) noexcept {
  const std::size_t cls = class_of(size);
  if (cls >= kClasses) {
    ::operator delete(p);
    return;
  }
  if (kBlockCacheOn && !t_cache_gone) {
    ThreadCache& cache = t_cache;
    if (cache.count[cls] < kCap && cache.bytes + block_size(cls) <= kMaxBytes) {
      auto* b = static_cast<FreeBlock*>(p);
      b->next = cache.head[cls];
      cache.head[cls] = b;
      ++cache.count[cls];
      cache.bytes += block_size(cls);
      return;
    }
  }
  ::operator delete(p);
}

void* TaskStateBase::operator new(std::size_t size) { return cached_alloc(size); }

void TaskStateBase::operator delete(void* p, std::size_t size) noexcept { cached_free(p, size); }

}  // namespace crew::detail

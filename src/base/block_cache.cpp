// A per-thread cache of freed small blocks (crew/detail/block_cache.hpp):
// task states (TaskStateBase's operator new and delete), their Extras, and
// callables too large for a cell (Cell::emplace).
//
// Why: a fork-join step allocates one state per child and frees it on the
// parent's thread after get(); a node with more children than glibc's
// per-thread cache keeps (7 blocks a size) sends the rest through the
// arena's locked free path. perf on skynet(6) with Task handles put malloc
// and free at about a fifth of all cycles.
//
// Blocks that flow one way: a thread that only submits (an event loop, a
// producer) allocates the states of tasks that other threads run and free.
// Its cache never refills, and the workers' caches overflow. Freed to the
// heap, those blocks went back to the submitter's malloc arena under its
// lock, against the submitter's own mallocs: with queue deadlines (a state
// and its Extras per task) perf put a fifth of the submitter's time in
// malloc and the arena lock's futex wake-ups. So a cache that overflows
// hands half a class's blocks (a batch of kBatch) to a process-wide depot,
// and a cache that runs dry takes a batch from it before it asks the heap:
// one lock per kBatch blocks, not one per block.
//
// Who touches what: each thread only its own cache (thread_local), without
// locks; a class's depot under its own spin lock, held to link or unlink
// one batch, and by a thread that forks, around the fork (lock_depot). No
// cache grows beyond kCap blocks of a size or about kMaxBytes in all, and
// no depot beyond kDepotBatches batches; past that, blocks go back to the
// heap. A thread's cache is returned to the heap when the thread exits; a
// block freed after that (by another thread_local's destructor) goes
// straight to the heap. What the depots hold at exit stays reachable from
// them.
//
// Under AddressSanitizer every block comes from and returns to the heap, so
// that a use after free of a task state is still caught.
#include "crew/detail/block_cache.hpp"

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "crew/detail/spin_lock.hpp"
#include "crew/detail/task_state.hpp"

namespace crew::detail {
namespace {

// Block sizes are multiples of malloc's own granule, so that a block that
// comes from the heap is the size the heap would have given anyway.
constexpr std::size_t kGrain = 16;
constexpr std::size_t kClasses = kMaxCachedBlock / kGrain;
constexpr std::uint32_t kCap = 64;  // blocks kept per size, per thread
// And at most this many bytes in all sizes together, per thread (a batch
// from the depot may take a thread past it by one batch).
constexpr std::size_t kMaxBytes = 64 * 1024;
// Blocks moved between a cache and the depot at once, and batches a class's
// depot holds at most (1,024 blocks: 512 KiB of the largest class).
constexpr std::uint32_t kBatch = kCap / 2;
constexpr std::size_t kDepotBatches = 32;

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

// One class's share of the process-wide depot: whole batches of kBatch
// blocks, each chained through FreeBlock::next.
struct alignas(64) Depot {
  SpinLock mu;
  std::size_t batches CREW_GUARDED_BY(mu) = 0;
  FreeBlock* batch[kDepotBatches] CREW_GUARDED_BY(mu){};
};
Depot g_depot[kClasses];

// fork() copies the depot's locks as they are: one held by another thread
// would stay held in the child, whose only thread would spin on it for ever
// once its cache ran dry or overflowed. So the forking thread takes every
// lock before the fork, and parent and child each release them after
// (glibc does the same for malloc's arenas). Each lock is held for a few
// instructions at a time, so a fork waits for nothing longer.
void lock_depot() noexcept CREW_NO_THREAD_SAFETY_ANALYSIS {
  for (Depot& d : g_depot) d.mu.lock();
}
void unlock_depot() noexcept CREW_NO_THREAD_SAFETY_ANALYSIS {
  for (Depot& d : g_depot) d.mu.unlock();
}
[[maybe_unused]] const int g_fork_handlers = pthread_atfork(lock_depot, unlock_depot, unlock_depot);

// Hands a batch to the depot; false if it is full (the caller frees it).
bool depot_put(std::size_t cls, FreeBlock* batch) noexcept {
  Depot& d = g_depot[cls];
  SpinLockGuard lock(d.mu);
  if (d.batches == kDepotBatches) return false;
  d.batch[d.batches++] = batch;
  return true;
}

// A batch of kBatch blocks, or null if the depot has none.
FreeBlock* depot_take(std::size_t cls) noexcept {
  Depot& d = g_depot[cls];
  SpinLockGuard lock(d.mu);
  return d.batches == 0 ? nullptr : d.batch[--d.batches];
}

void free_chain(FreeBlock* b) noexcept {
  while (b != nullptr) ::operator delete(std::exchange(b, b->next));
}

// Set once this thread's cache has been destroyed (thread exit).
constinit thread_local bool t_cache_gone = false;
constinit thread_local ThreadCache t_cache{};

ThreadCache::~ThreadCache() {
  t_cache_gone = true;
  for (FreeBlock*& h : head) free_chain(std::exchange(h, nullptr));
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
    // Dry: blocks that other threads freed, a batch at once.
    if (cache.bytes + kBatch * block_size(cls) <= kMaxBytes) {
      if (FreeBlock* b = depot_take(cls)) {
        cache.head[cls] = b->next;
        cache.count[cls] = kBatch - 1;
        cache.bytes += (kBatch - 1) * block_size(cls);
        return b;
      }
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
    if (cache.count[cls] == kCap) {
      // Full: the kBatch blocks on top go to the depot (or the heap), as one
      // chain.
      FreeBlock* batch = cache.head[cls];
      FreeBlock* last = batch;
      for (std::uint32_t i = 1; i < kBatch; ++i) last = last->next;
      cache.head[cls] = last->next;
      last->next = nullptr;
      cache.count[cls] -= kBatch;
      cache.bytes -= kBatch * block_size(cls);
      if (!depot_put(cls, batch)) free_chain(batch);
    }
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

void* TaskStateBase::Extras::operator new(std::size_t size) { return cached_alloc(size); }

void TaskStateBase::Extras::operator delete(void* p, std::size_t size) noexcept {
  cached_free(p, size);
}

}  // namespace crew::detail

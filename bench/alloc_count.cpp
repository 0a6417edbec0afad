// bench/alloc_count.cpp: counting replacements of the C and C++ allocators.
//
// glibc exports its allocator under __libc_* names, so these replacements can
// forward to it without dlsym (which itself allocates). A single shared
// atomic counter would add a contended cache line to every allocation and
// slow the allocation-heavy pools more than the others, so counts go to 64
// cache-line-sized slots, one picked per thread; slots are shared only when
// more than 64 threads have existed (pools are created per measurement), so
// the increment stays an atomic read-modify-write.
#include "alloc_count.hpp"

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <new>

extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t n, std::size_t size);
void* __libc_realloc(void* p, std::size_t size);
void* __libc_memalign(std::size_t alignment, std::size_t size);
void __libc_free(void* p);
}

namespace {

constexpr unsigned kSlots = 64;

struct alignas(64) Slot {
  std::atomic<std::uint64_t> count{0};
};

constinit Slot g_slots[kSlots];
constinit std::atomic<unsigned> g_next_slot{0};
// Trivially initialised: usable before and during thread start-up.
constinit thread_local unsigned t_slot = kSlots;

void count_one() noexcept {
  if (t_slot == kSlots) {
    t_slot = g_next_slot.fetch_add(1, std::memory_order_relaxed) % kSlots;
  }
  g_slots[t_slot].count.fetch_add(1, std::memory_order_relaxed);
}

bool valid_alignment(std::size_t alignment) noexcept {
  return alignment != 0 && (alignment & (alignment - 1)) == 0;
}

void* aligned_or_throw(std::size_t size, std::align_val_t alignment) {
  const auto align = static_cast<std::size_t>(alignment);
  count_one();
  void* p = __libc_memalign(align, size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* plain_or_throw(std::size_t size) {
  count_one();
  void* p = __libc_malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

namespace bench {

std::uint64_t allocations() noexcept {
  std::uint64_t total = 0;
  for (const Slot& s : g_slots) total += s.count.load(std::memory_order_relaxed);
  return total;
}

}  // namespace bench

// ---- C allocators ----

extern "C" {

void* malloc(std::size_t size) {
  count_one();
  return __libc_malloc(size);
}

void* calloc(std::size_t n, std::size_t size) {
  count_one();
  return __libc_calloc(n, size);
}

void* realloc(void* p, std::size_t size) {
  count_one();
  return __libc_realloc(p, size);
}

void free(void* p) { __libc_free(p); }

// The aligned allocators free through free(); replacing them keeps aligned
// allocations (TBB, aligned operator new) visible to the counter.
void* memalign(std::size_t alignment, std::size_t size) {
  count_one();
  return __libc_memalign(alignment, size);
}

void* aligned_alloc(std::size_t alignment, std::size_t size) {
  if (!valid_alignment(alignment)) {
    errno = EINVAL;
    return nullptr;
  }
  count_one();
  return __libc_memalign(alignment, size);
}

int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
  if (!valid_alignment(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  count_one();
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

}  // extern "C"

// ---- C++ operators ----

void* operator new(std::size_t size) { return plain_or_throw(size); }
void* operator new[](std::size_t size) { return plain_or_throw(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  count_one();
  return __libc_malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  count_one();
  return __libc_malloc(size == 0 ? 1 : size);
}
void* operator new(std::size_t size, std::align_val_t al) { return aligned_or_throw(size, al); }
void* operator new[](std::size_t size, std::align_val_t al) { return aligned_or_throw(size, al); }
void* operator new(std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  count_one();
  return __libc_memalign(static_cast<std::size_t>(al), size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  count_one();
  return __libc_memalign(static_cast<std::size_t>(al), size == 0 ? 1 : size);
}

void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete(void* p, std::size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::size_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  __libc_free(p);
}

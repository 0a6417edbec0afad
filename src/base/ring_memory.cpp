// The memory of a queue's rings (crew/detail/ring.hpp): out of line,
// so that the installed headers need no <sys/mman.h>. Rings are made when
// a pool is constructed, never on a submission.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "crew/detail/ring.hpp"

namespace crew::detail {
namespace {

// Rings this large or larger are mapped: a pool's queue is sized for its
// worst burst, and most of it is never touched.
constexpr std::size_t kMapThreshold = std::size_t{128} << 10;

}  // namespace

void* allocate_ring_memory(std::size_t bytes, std::size_t align) {
  if (bytes >= kMapThreshold) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;  // anonymous mappings are zeroed and page-aligned
  }
  void* p = std::aligned_alloc(align, bytes);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return p;
}

void release_ring_memory(void* p, std::size_t bytes) noexcept {
  if (bytes >= kMapThreshold) {
    ::munmap(p, bytes);
  } else {
    std::free(p);
  }
}

}  // namespace crew::detail

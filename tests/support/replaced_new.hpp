// Replaces the global operator new and delete of the test binary that
// includes this header (include it in exactly one translation unit): every
// allocation is counted, and the calling thread's N-th allocation from now
// can be made to throw std::bad_alloc (fault injection). new and delete are
// replaced as a pair, which g++'s mismatch warning cannot see. A thread
// can also be held in its next allocation (AllocationGate).
//
// Under clang's ThreadSanitizer the runtime is linked into the binary whole,
// with an operator new of its own, so a second definition does not link.
// There (CREW_TEST_WRAP_NEW, set by crew_test_replaces() in tests/CMakeLists.txt) the
// binary is linked with -Wl,--wrap=_Znwm instead: calls of
// operator new(std::size_t) from the binary's own objects (the test and
// libcrew.a, not libstdc++.so) come here, and __real__Znwm is the runtime's.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace crew::test {

// Allocations made through operator new in this binary, on any thread.
inline std::atomic<std::uint64_t> g_allocations{0};
// 0: off; N > 0: the N-th allocation on this thread from now throws.
inline thread_local long t_fail_allocation_in = 0;

// Holds a thread where the code under test allocates: a thread that sets
// t_hold_next_allocation (a task on a worker, say) waits in its next
// allocation, after setting `held`, until `open` is set.
struct AllocationGate {
  std::atomic<bool> held{false};
  std::atomic<bool> open{false};
};
inline thread_local AllocationGate* t_hold_next_allocation = nullptr;

// Counts the allocation, throws if the calling thread asked for it, and
// waits at the thread's gate if it set one.
inline void note_allocation() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  long& fail_in = t_fail_allocation_in;
  if (fail_in > 0 && --fail_in == 0) throw std::bad_alloc();
  if (AllocationGate* gate = t_hold_next_allocation) {
    t_hold_next_allocation = nullptr;
    gate->held.store(true);
    gate->held.notify_all();
    gate->open.wait(false);
  }
}

}  // namespace crew::test

#if defined(CREW_TEST_WRAP_NEW)
// NOLINTBEGIN(bugprone-reserved-identifier,readability-identifier-naming): the linker's names
extern "C" void* __real__Znwm(std::size_t size);
extern "C" void* __wrap__Znwm(std::size_t size) {
  crew::test::note_allocation();
  return __real__Znwm(size);
}
// NOLINTEND(bugprone-reserved-identifier,readability-identifier-naming)
#else
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t size) {
  crew::test::note_allocation();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

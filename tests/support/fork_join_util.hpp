// tests/support/fork_join_util.hpp: fork-join workloads for the tests of
// worker-local queues (tests/pool/fork_join_test.cpp,
// tests/engine/local_queue_test.cpp): fib through Group and through Task
// handles, the number of tasks it creates, and a probe of the deepest
// stack a worker used.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "crew/group.hpp"
#include "crew/pool.hpp"
#include "peak.hpp"
#include "test_util.hpp"

namespace crew::test {

// Sanitizer builds: smaller workloads.
inline constexpr bool kSanitized = kSlowdown > 1;

// The deepest stack any worker used, measured from the address of a local
// in on_worker_start to the address of a local in each task.
class StackProbe {
 public:
  PoolOptions attach(PoolOptions o) {
    o.on_worker_start = [](std::uint64_t) {
      const char top = 0;
      t_top = reinterpret_cast<std::uintptr_t>(&top);
    };
    return o;
  }
  void sample() noexcept {
    const char here = 0;
    const auto sp = reinterpret_cast<std::uintptr_t>(&here);
    if (t_top == 0 || sp > t_top) return;  // not on a worker
    const std::uintptr_t used = t_top - sp;
    raise_peak(peak_, used, std::memory_order_relaxed);
  }
  [[nodiscard]] std::uintptr_t peak() const noexcept {
    return peak_.load(std::memory_order_relaxed);
  }

 private:
  static inline thread_local std::uintptr_t t_top = 0;
  std::atomic<std::uintptr_t> peak_{0};
};

inline std::uint64_t fib_serial(int n) {
  return n < 2 ? static_cast<std::uint64_t>(n) : fib_serial(n - 1) + fib_serial(n - 2);
}

// One task per call, a Group per node.
inline std::uint64_t fib_group(Pool& pool, StackProbe& probe, int n) {
  probe.sample();
  if (n < 2) return static_cast<std::uint64_t>(n);
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  Group g(pool);
  EXPECT_EQ(g.submit([&] { a = fib_group(pool, probe, n - 1); }), Admission::accepted);
  EXPECT_EQ(g.submit([&] { b = fib_group(pool, probe, n - 2); }), Admission::accepted);
  g.wait();
  return a + b;
}

// One task per call, joined through its handle.
inline std::uint64_t fib_task(Pool& pool, StackProbe& probe, int n) {
  probe.sample();
  if (n < 2) return static_cast<std::uint64_t>(n);
  Task<std::uint64_t> a = pool.submit([&pool, &probe, n] { return fib_task(pool, probe, n - 1); });
  Task<std::uint64_t> b = pool.submit([&pool, &probe, n] { return fib_task(pool, probe, n - 2); });
  return a.get() + b.get();
}

// Tasks fib(n) creates: one per call.
inline std::uint64_t fib_calls(int n) { return 2 * fib_serial(n + 1) - 1; }

}  // namespace crew::test

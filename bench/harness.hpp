// bench/harness.hpp: the workloads of crew_bench, written once against a
// small "adapter" interface that each pool under test implements:
//
//   struct Adapter {
//     static constexpr std::string_view kName, kAllocNote;  // impl name, caveat
//     Adapter();                  // builds a fresh pool with kWorkers workers
//     void post(F&& f);           // fire-and-forget submission
//     Handle submit(F&& f);       // optional: a handle whose get() waits
//     void produce(Fn&& fn);      // runs a producer body (fn posts the tasks);
//                                 // TBB's task_group needs it inside its arena
//     static std::string_view skip_reason(Workload);  // "" if supported
//   };
//
// Each measurement builds its pool, primes it, then times one workload with
// timed(): wall time and allocation count of the region, divided by the
// number of tasks. The pool is built and destroyed outside that region.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "alloc_count.hpp"

namespace bench {

inline constexpr std::size_t kWorkers = 2;    // the machine has 2 cores
inline constexpr std::size_t kProducers = 4;  // producers_4

enum class Workload {
  short_detached,
  short_future,
  producers_4,
  factorial,
  long_deadline,
  group_wait,       // crew_structured.cpp
  funcpool_invoke,  // crew_structured.cpp
  parallel_for,     // crew_structured.cpp, impl_tbb_parallel_for.cpp
};

inline constexpr std::array kWorkloads = {Workload::short_detached,  Workload::short_future,
                                          Workload::producers_4,     Workload::factorial,
                                          Workload::long_deadline,   Workload::group_wait,
                                          Workload::funcpool_invoke, Workload::parallel_for};

// parallel_for runs over this many indices per --tasks (10,000,000 by
// default); its figures are per index.
inline constexpr std::size_t kIndicesPerTask = 10;

[[nodiscard]] constexpr std::string_view name_of(Workload w) {
  switch (w) {
    case Workload::short_detached:
      return "short_detached";
    case Workload::short_future:
      return "short_future";
    case Workload::producers_4:
      return "producers_4";
    case Workload::factorial:
      return "factorial";
    case Workload::long_deadline:
      return "long_deadline";
    case Workload::group_wait:
      return "group_wait";
    case Workload::funcpool_invoke:
      return "funcpool_invoke";
    case Workload::parallel_for:
      return "parallel_for";
  }
  return "?";
}

struct Sample {
  double ns_per_task = 0;
  double allocs_per_task = 0;
};

// One pool implementation as the driver in main.cpp sees it.
class Impl {
 public:
  virtual ~Impl() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  // Empty if the workload is supported; otherwise why it is skipped.
  [[nodiscard]] virtual std::string_view skip_reason(Workload w) const = 0;
  // One measurement of `tasks` tasks on a freshly built pool.
  virtual Sample run(Workload w, std::size_t tasks) = 0;
  // How many distinct threads run tasks: checks the "2 workers" setup.
  virtual std::size_t executing_threads() = 0;
  // A caveat about the allocation counts of this implementation, if any.
  [[nodiscard]] virtual std::string_view alloc_note() const { return {}; }
};

// Defined in the impl_*.cpp files.
std::unique_ptr<Impl> make_crew_impl();
std::unique_ptr<Impl> make_crew_fifo_impl();
std::unique_ptr<Impl> make_crew_priority_impl();
std::unique_ptr<Impl> make_crew_metrics_impl();        // built with crew::metrics
std::unique_ptr<Impl> make_crew_null_observer_impl();  // built with crew::metrics
std::unique_ptr<Impl> make_tbb_enqueue_impl();
std::unique_ptr<Impl> make_tbb_task_group_impl();
std::unique_ptr<Impl> make_tbb_parallel_for_impl();

// crew_structured.cpp: which implementations run group_wait, funcpool_invoke
// and parallel_for ("" if `impl` does), and crew's runs of them.
std::string_view structured_skip_reason(std::string_view impl, Workload w);
Sample run_crew_structured(Workload w, std::size_t tasks);
std::unique_ptr<Impl> make_asio_impl();
std::unique_ptr<Impl> make_thread_pool_deb_impl();

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "crew_bench: %s\n", what);
  std::abort();
}

// ---- timing ----

template <class Body>
Sample timed(std::size_t tasks, Body&& body) {
  const std::uint64_t allocs_before = allocations();
  const auto start = std::chrono::steady_clock::now();
  body();
  const auto stop = std::chrono::steady_clock::now();
  const std::uint64_t allocs_after = allocations();
  const auto n = static_cast<double>(std::max<std::size_t>(tasks, 1));
  return {static_cast<double>(std::chrono::nanoseconds(stop - start).count()) / n,
          static_cast<double>(allocs_after - allocs_before) / n};
}

// Waits until `value` equals `target`. Polls with short sleeps rather than
// spinning or yielding: on 2 cores a spinning waiter would compete with the
// 2 workers it waits for. The sleep adds at most ~0.2 ms to a run of
// 1,000,000 tasks.
inline void wait_for_value(const std::atomic<std::uint64_t>& value, std::uint64_t target) {
  while (value.load(std::memory_order_acquire) != target) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// ---- task bodies ----

// Read by every factorial task, so the compiler cannot fold factorial(20).
inline volatile std::uint64_t g_factorial_n = 20;

[[nodiscard]] inline std::uint64_t factorial_of_volatile_n() noexcept {
  const std::uint64_t n = g_factorial_n;
  std::uint64_t result = 1;
  for (std::uint64_t k = 2; k <= n; ++k) result *= k;
  return result;
}

inline constexpr std::uint64_t kFactorial20 = 2432902008176640000ULL;

// ---- workloads ----

template <class A>
concept HasSubmit = requires(A& a) {
  {
    a.submit([]() -> std::uint64_t { return 0; }).get()
    } -> std::convertible_to<std::uint64_t>;
};

// Runs a few tasks so that the workers are started and parked before timing.
template <class A>
void prime(A& pool) {
  constexpr std::uint64_t kTasks = 16 * kWorkers;
  std::atomic<std::uint64_t> done{0};
  pool.produce([&] {
    for (std::uint64_t i = 0; i < kTasks; ++i) {
      pool.post([&done]() noexcept { done.fetch_add(1, std::memory_order_release); });
    }
  });
  wait_for_value(done, kTasks);
}

template <class A>
Sample run_short_detached(std::size_t tasks) {
  A pool;
  prime(pool);
  std::atomic<std::uint64_t> done{0};
  return timed(tasks, [&] {
    pool.produce([&] {
      for (std::size_t i = 0; i < tasks; ++i) {
        pool.post([&done]() noexcept { done.fetch_add(1, std::memory_order_release); });
      }
    });
    wait_for_value(done, tasks);
  });
}

// Each task returns its ticket; the sum of all results checks every get().
template <class A>
Sample run_short_future(std::size_t tasks) {
  A pool;
  prime(pool);
  std::atomic<std::uint64_t> next{0};
  auto task = [&next]() noexcept { return next.fetch_add(1, std::memory_order_relaxed); };
  using Handle = decltype(pool.submit(task));
  // Reserved outside the timed region: the handles' storage is the caller's,
  // not the pool's.
  std::vector<Handle> handles;
  handles.reserve(tasks);
  std::uint64_t sum = 0;
  const Sample s = timed(tasks, [&] {
    pool.produce([&] {
      for (std::size_t i = 0; i < tasks; ++i) handles.push_back(pool.submit(task));
    });
    for (Handle& h : handles) sum += h.get();
    handles.clear();  // releasing the handles is part of the per-task cost
  });
  const std::uint64_t n = tasks;
  if (sum != (n == 0 ? 0 : n * (n - 1) / 2)) fail("short_future: wrong sum of results");
  return s;
}

// kProducers threads post their share each; timing starts when they are
// released together.
template <class A>
Sample run_producers(std::size_t tasks) {
  A pool;
  prime(pool);
  std::atomic<std::uint64_t> done{0};
  std::latch ready(static_cast<std::ptrdiff_t>(kProducers));
  std::atomic<bool> go{false};
  std::vector<std::jthread> producers;
  for (std::size_t p = 0; p < kProducers; ++p) {
    const std::size_t share = tasks / kProducers + (p < tasks % kProducers ? 1 : 0);
    producers.emplace_back([&, share] {
      ready.count_down();
      go.wait(false, std::memory_order_acquire);
      pool.produce([&] {
        for (std::size_t i = 0; i < share; ++i) {
          pool.post([&done]() noexcept { done.fetch_add(1, std::memory_order_release); });
        }
      });
    });
  }
  ready.wait();
  const Sample s = timed(tasks, [&] {
    go.store(true, std::memory_order_release);
    go.notify_all();
    wait_for_value(done, tasks);
  });
  producers.clear();  // joins
  return s;
}

// Completion is detected on the sum itself: k * 20! mod 2^64 first equals
// n * 20! mod 2^64 at k == n for any n < 2^46 (20! = 2^18 * odd), so the
// task needs no second atomic.
template <class A>
Sample run_factorial(std::size_t tasks) {
  A pool;
  prime(pool);
  std::atomic<std::uint64_t> sum{0};
  const std::uint64_t expected = static_cast<std::uint64_t>(tasks) * kFactorial20;
  return timed(tasks, [&] {
    pool.produce([&] {
      for (std::size_t i = 0; i < tasks; ++i) {
        pool.post([&sum]() noexcept {
          sum.fetch_add(factorial_of_volatile_n(), std::memory_order_release);
        });
      }
    });
    wait_for_value(sum, expected);
  });
}

// Tasks that sleep long enough for every worker to pick some up.
template <class A>
std::size_t count_executing_threads() {
  constexpr std::uint64_t kTasks = 20 * kWorkers;
  A pool;
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::atomic<std::uint64_t> done{0};
  pool.produce([&] {
    for (std::uint64_t i = 0; i < kTasks; ++i) {
      pool.post([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        {
          const std::lock_guard lock(mu);
          seen.insert(std::this_thread::get_id());
        }
        done.fetch_add(1, std::memory_order_release);
      });
    }
  });
  wait_for_value(done, kTasks);
  const std::lock_guard lock(mu);
  return seen.size();
}

// The Impl for an adapter: dispatches the generic workloads above.
template <class A>
class AdapterImpl : public Impl {
 public:
  [[nodiscard]] std::string_view name() const override { return A::kName; }
  [[nodiscard]] std::string_view skip_reason(Workload w) const override {
    const std::string_view structured = structured_skip_reason(A::kName, w);
    return structured.empty() ? A::skip_reason(w) : structured;
  }
  [[nodiscard]] std::string_view alloc_note() const override { return A::kAllocNote; }
  std::size_t executing_threads() override { return count_executing_threads<A>(); }

  Sample run(Workload w, std::size_t tasks) override {
    switch (w) {
      case Workload::short_detached:
        return run_short_detached<A>(tasks);
      case Workload::short_future:
        if constexpr (HasSubmit<A>) return run_short_future<A>(tasks);
        break;
      case Workload::producers_4:
        return run_producers<A>(tasks);
      case Workload::factorial:
        return run_factorial<A>(tasks);
      case Workload::long_deadline:
      case Workload::group_wait:
      case Workload::funcpool_invoke:
      case Workload::parallel_for:
        break;
    }
    fail("workload not supported by this implementation");
  }
};

}  // namespace bench

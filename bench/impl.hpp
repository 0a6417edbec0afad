// bench/impl.hpp: what crew_bench measures and with what: the workloads
// (Workload, their names and sizes), a measurement (Sample) and a latency
// run (LatencySpec, LatencySample, LatencyBuffers), an implementation under
// test (Impl) and the factory of each, the shared counter, timed() and the
// task bodies. harness.hpp writes the workloads on top of it.
#pragma once

#include <sched.h>
#include <sys/resource.h>

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

// The allocation caveat of every crew series: crew keeps freed task states
// and boxed callables for reuse (crew/detail/block_cache.hpp).
inline constexpr std::string_view kCrewAllocNote =
    "crew reuses freed task states and boxed callables (a per-thread cache of up to 64 blocks "
    "a size, and a process-wide depot of up to 1,024 through which blocks freed on other "
    "threads come back, crew/detail/block_cache.hpp); only the misses of both reach malloc "
    "and are counted";

inline constexpr std::size_t kWorkers = 2;    // the machine has 2 cores
inline constexpr std::size_t kProducers = 4;  // producers_4

enum class Workload {
  short_detached,
  short_future,
  producers_4,
  factorial,
  long_deadline,
  queue_deadline,   // impl_crew.cpp: short_detached with a queue deadline
  group_wait,       // crew_structured.cpp
  funcpool_invoke,  // crew_structured.cpp
  parallel_for,     // crew_structured.cpp, impl_tbb_parallel_for.cpp
  fib,              // fork-join (forkjoin.hpp): crew, crew_task, tbb_task_group
  skynet,
  nqueens,
  matmul,
  three_pools,  // impl_crew.cpp: three crew pools, one producer each
  one_pool,     // impl_crew.cpp: the same work on one pool, three producers
};

inline constexpr std::array kWorkloads = {Workload::short_detached, Workload::short_future,
                                          Workload::producers_4,    Workload::factorial,
                                          Workload::long_deadline,  Workload::queue_deadline,
                                          Workload::group_wait,     Workload::funcpool_invoke,
                                          Workload::parallel_for,   Workload::fib,
                                          Workload::skynet,         Workload::nqueens,
                                          Workload::matmul,         Workload::three_pools,
                                          Workload::one_pool};

[[nodiscard]] constexpr bool is_fork_join(Workload w) {
  return w == Workload::fib || w == Workload::skynet || w == Workload::nqueens ||
         w == Workload::matmul;
}

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
    case Workload::queue_deadline:
      return "queue_deadline";
    case Workload::group_wait:
      return "group_wait";
    case Workload::funcpool_invoke:
      return "funcpool_invoke";
    case Workload::parallel_for:
      return "parallel_for";
    case Workload::fib:
      return "fib";
    case Workload::skynet:
      return "skynet";
    case Workload::nqueens:
      return "nqueens";
    case Workload::matmul:
      return "matmul";
    case Workload::three_pools:
      return "three_pools";
    case Workload::one_pool:
      return "one_pool";
  }
  return "?";
}

struct Sample {
  double ns_per_task = 0;
  double allocs_per_task = 0;
  // Fork-join runs with stack tracking on (forkjoin.hpp): the deepest stack
  // any thread reached while running the workload's tasks, in KiB.
  double stack_kib = 0;
  // cross_core_round_trip_ns() measured just before this round's runs of
  // the workload (the same figure for every implementation in the round).
  double cross_core_ns = 0;
  // Empty when measured; otherwise why there is no figure ("SIGSEGV",
  // "timeout after 60 s": a run in a child process that did not finish).
  std::string failure;
};

// The latency workload: one producer posts tasks at intended times
// t0 + i / rate; each task records its start time and adds to a counter.
struct LatencySpec {
  double rate = 0;     // target tasks per second
  double seconds = 0;  // how long the producer sends
};

struct LatencySample {
  double rate = 0;           // target
  double achieved_rate = 0;  // tasks / (last task's start - t0)
  // Task start minus its intended send time: a producer that falls behind
  // (a blocking post, a full queue) is charged for it (coordinated omission).
  double p50_us = 0, p99_us = 0, p999_us = 0;
  // Task start minus the moment the producer called post(): the pool's share.
  double sched_p50_us = 0, sched_p99_us = 0, sched_p999_us = 0;
  // Context switches of the whole process per second of the run
  // (getrusage): voluntary ones are threads that blocked (a worker going to
  // sleep, so a wake-up later); involuntary ones are threads preempted or
  // yielding their CPU to another.
  double voluntary_switches_per_s = 0, involuntary_switches_per_s = 0;
};

// The timestamps of a latency run, in steady_clock nanoseconds. Allocated
// and written once before the producer starts, so that neither allocation
// nor first-touch page faults happen while it sends.
// With a trace_path, each task also notes the CPU it started on, and the
// run writes one line per task there (write_latency_trace).
struct LatencyBuffers {
  std::vector<std::int64_t> post_ns;   // when the producer called post()
  std::vector<std::int64_t> start_ns;  // when the task started
  std::vector<std::uint16_t> cpu;      // with a trace_path only
  std::string trace_path;              // empty: no trace
  void prepare(std::size_t n) {
    post_ns.assign(n, 0);
    start_ns.assign(n, 0);
    cpu.assign(trace_path.empty() ? 0 : n, 0);
  }
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
  // Whether it takes part in the latency workload, and one run of it.
  [[nodiscard]] virtual bool runs_latency() const { return false; }
  virtual LatencySample run_latency(const LatencySpec& spec, LatencyBuffers& buffers);
};

// Defined in the impl_*.cpp files.
std::unique_ptr<Impl> make_crew_impl();
std::unique_ptr<Impl> make_crew_unbounded_impl();
std::unique_ptr<Impl> make_crew_overload_impl();
std::unique_ptr<Impl> make_crew_task_impl();  // crew_forkjoin.cpp
std::unique_ptr<Impl> make_crew_fifo_impl();
std::unique_ptr<Impl> make_crew_priority_impl();
std::unique_ptr<Impl> make_crew_metrics_impl();        // built with crew::metrics
std::unique_ptr<Impl> make_crew_null_observer_impl();  // built with crew::metrics
std::unique_ptr<Impl> make_tbb_enqueue_impl();
std::unique_ptr<Impl> make_tbb_task_group_impl();
std::unique_ptr<Impl> make_tbb_parallel_for_impl();

// crew_structured.cpp: which implementations run group_wait, funcpool_invoke,
// parallel_for, the crew-only workloads and the fork-join ones ("" if `impl`
// does), and crew's runs of the structured ones.
std::string_view structured_skip_reason(std::string_view impl, Workload w);
Sample run_crew_structured(Workload w, std::size_t tasks);
// crew_forkjoin.cpp: impl crew (a Group per node) and crew_task (Task
// handles) on a fork-join workload.
Sample run_crew_fork_join(Workload w);
Sample run_crew_task_fork_join(Workload w);
std::unique_ptr<Impl> make_asio_impl();
std::unique_ptr<Impl> make_thread_pool_deb_impl();
std::unique_ptr<Impl> make_polling_thread_impl();  // latency only: the machine's floor

// Set in a child process of run_isolated() (isolate.hpp): fail() then exits
// with kFailedCheckExit, which the parent turns into a failure of the run.
inline bool g_in_isolated_child = false;
inline constexpr int kFailedCheckExit = 86;

// A wrong result or a refused task: the whole benchmark stops, loudly.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "crew_bench: %s\n", what);
  if (g_in_isolated_child) {
    std::fflush(stderr);
    std::_Exit(kFailedCheckExit);
  }
  std::abort();
}

// The counter a workload's tasks add to (completions, a running sum, the
// next ticket), alone on its cache line. A plain local would share a line
// with the producer's other locals (the closures it reads on every post),
// and each task's update would stall the producer's next read of them: a
// cross-core transfer per task, whichever pool runs the tasks, which
// measured false sharing rather than the pool (on this machine it made
// 1,000,000 posts 1.5-2x slower when cross-core transfers were dear).
struct alignas(64) Counter : std::atomic<std::uint64_t> {
  Counter() noexcept : std::atomic<std::uint64_t>(0) {}
  using std::atomic<std::uint64_t>::operator=;
};
static_assert(sizeof(Counter) == 64);

// ---- timing ----

template <class Body>
Sample timed(std::size_t tasks, Body&& body) {
  const std::uint64_t allocs_before = allocations();
  const auto start = std::chrono::steady_clock::now();
  body();
  const auto stop = std::chrono::steady_clock::now();
  const std::uint64_t allocs_after = allocations();
  const auto n = static_cast<double>(std::max<std::size_t>(tasks, 1));
  Sample s;
  s.ns_per_task = static_cast<double>(std::chrono::nanoseconds(stop - start).count()) / n;
  s.allocs_per_task = static_cast<double>(allocs_after - allocs_before) / n;
  return s;
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

[[nodiscard]] inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
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

}  // namespace bench

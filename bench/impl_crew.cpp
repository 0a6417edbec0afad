// bench/impl_crew.cpp: crew's adapter, its long_deadline, three_pools and
// one_pool workloads, and the crew-only measurements (idle CPU, queued
// memory, allocations per post).
//
// Every crew row runs a pool with default PoolOptions except kWorkers
// workers (min and max, like the competitors' fixed 2 threads); the
// variants change one thing each and are named for it: crew_unbounded
// (queue_capacity = kUnbounded), crew_fifo (one queue shard), crew_priority
// (4 priority levels), crew_overload (the overload controller on, with a
// target of 10 s and a ceiling above the queue's bound, so that it never
// refuses or sheds: what its bookkeeping costs a pool that is not
// overloaded).
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <crew/pool.hpp>
#include <fstream>
#include <latch>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "crew_extras.hpp"
#include "harness.hpp"

namespace bench {
namespace {

// Options are assigned field by field rather than with designated
// initializers, which draw -Wmissing-field-initializers from g++ 12.
crew::PoolOptions bench_options(std::size_t shards, std::size_t levels, bool unbounded,
                                bool overload) {
  crew::PoolOptions o;
  o.name = "bench";
  o.min_workers = kWorkers;
  o.max_workers = kWorkers;
  if (unbounded) o.queue_capacity = crew::kUnbounded;
  o.queue_shards = shards;
  o.priority_levels = levels;
  if (overload) {
    o.overload.enabled = true;
    o.overload.target = std::chrono::seconds(10);
    // Above what the queue holds: at the default ceiling (queue capacity
    // plus workers) the limit would refuse where Overflow::block waits.
    o.overload.max_limit = std::size_t{1} << 30;
  }
  return o;
}

crew::PoolOptions idle_options(std::size_t min_workers) {
  crew::PoolOptions o;
  o.name = "idle";
  o.min_workers = min_workers;
  return o;
}

void expect_accepted(crew::Admission a) {
  if (a != crew::Admission::accepted) fail("crew refused a task");
}

// kShards: 0 = the pool's default sharded queue ("crew"); 1 = one FIFO
// queue across producers ("crew_fifo"). kLevels > 1: a pool with that many
// priority levels, every task posted at the top one ("crew_priority"; what
// a pool with priorities costs against "crew", which has none).
// kUnbounded: queue_capacity = kUnbounded instead of the default bound
// ("crew_unbounded").
template <std::size_t kShards, std::size_t kLevels = 1, bool kUnbounded = false,
          bool kOverload = false>
struct CrewAdapter {
  static constexpr std::string_view kName = kOverload      ? "crew_overload"
                                            : kUnbounded   ? "crew_unbounded"
                                            : kLevels > 1  ? "crew_priority"
                                            : kShards == 1 ? "crew_fifo"
                                                           : "crew";
  static constexpr std::string_view kAllocNote = kCrewAllocNote;
  static constexpr bool kLatency = kName == "crew";
  static constexpr crew::TaskOptions options() {
    crew::TaskOptions o;
    o.priority = static_cast<std::uint8_t>(kLevels - 1);
    return o;
  }

  crew::Pool pool{bench_options(kShards, kLevels, kUnbounded, kOverload)};

  template <class F>
  void post(F&& f) {
    if constexpr (kLevels > 1) {
      expect_accepted(pool.post(std::forward<F>(f), options()));
    } else {
      expect_accepted(pool.post(std::forward<F>(f)));
    }
  }
  template <class F>
  auto submit(F&& f) {
    return pool.submit(std::forward<F>(f), options());
  }
  template <class Fn>
  void produce(Fn&& fn) {
    fn();
  }
  static std::string_view skip_reason(Workload) { return ""; }
};
using Crew = CrewAdapter<0>;
using CrewFifo = CrewAdapter<1>;
using CrewPriority = CrewAdapter<0, 4>;
using CrewUnbounded = CrewAdapter<0, 1, true>;
using CrewOverload = CrewAdapter<0, 1, false, true>;

// short_detached's loop, every task posted with `opts`; `body(done)` makes
// the task. Returns the sample and the pool's outcomes once idle.
template <class C, class Body>
std::pair<Sample, crew::OutcomeCounts> run_with_options(std::size_t tasks,
                                                        const crew::TaskOptions& opts, Body body) {
  C c;
  prime(c);
  Counter done;
  const Sample s = timed(tasks, [&] {
    for (std::size_t i = 0; i < tasks; ++i) expect_accepted(c.pool.post(body(done), opts));
    wait_for_value(done, tasks);
  });
  c.pool.wait_idle();
  return {s, c.pool.stats().outcomes};
}

// Long tasks take the slow path (a task state with a deadline); the 1 s
// deadline is far beyond a task's run time, so none may expire.
template <class C>
Sample run_long_deadline(std::size_t tasks) {
  const auto [s, outcomes] =
      run_with_options<C>(tasks, {.timeout = std::chrono::seconds(1)}, [](Counter& done) {
        return [&done](std::stop_token) noexcept { done.fetch_add(1, std::memory_order_release); };
      });
  if (outcomes.timed_out != 0) fail("long_deadline: a task timed out");
  return s;
}

// short_detached's tasks, each with a queue deadline (TaskOptions::
// queue_timeout) of 1 s, far beyond any task's wait, so none may expire:
// the cost of arming the deadline at submission and disarming it at start,
// against crew's short_detached in the same round.
template <class C>
Sample run_queue_deadline(std::size_t tasks) {
  const auto [s, outcomes] =
      run_with_options<C>(tasks, {.queue_timeout = std::chrono::seconds(1)}, [](Counter& done) {
        return [&done]() noexcept { done.fetch_add(1, std::memory_order_release); };
      });
  if (outcomes.rejected != 0) fail("queue_deadline: a task expired");
  return s;
}

// kPools pools, one producer thread each, or (kPools == 1) one pool fed by
// kProducers3 producers: the same tasks and threads submitting, once spread
// over three pools as in a service with several (crewd has three). Tasks
// of producer p count on their own cache line in both cases.
constexpr std::size_t kProducers3 = 3;

template <class C, std::size_t kPools>
Sample run_pools(std::size_t tasks) {
  std::array<C, kPools> pools;
  for (C& c : pools) prime(c);
  std::array<Counter, kProducers3> counters;
  std::array<std::size_t, kProducers3> shares{};
  for (std::size_t p = 0; p < kProducers3; ++p) {
    shares[p] = tasks / kProducers3 + (p < tasks % kProducers3 ? 1 : 0);
  }
  std::latch ready(static_cast<std::ptrdiff_t>(kProducers3));
  std::atomic<bool> go{false};
  std::vector<std::jthread> producers;
  for (std::size_t p = 0; p < kProducers3; ++p) {
    producers.emplace_back([&, p] {
      C& c = pools[p % kPools];
      std::atomic<std::uint64_t>* done = &counters[p];
      ready.count_down();
      go.wait(false, std::memory_order_acquire);
      for (std::size_t i = 0; i < shares[p]; ++i) {
        c.post([done]() noexcept { done->fetch_add(1, std::memory_order_release); });
      }
    });
  }
  ready.wait();
  const Sample s = timed(tasks, [&] {
    go.store(true, std::memory_order_release);
    go.notify_all();
    for (std::size_t p = 0; p < kProducers3; ++p) wait_for_value(counters[p], shares[p]);
  });
  producers.clear();  // joins
  return s;
}

template <class C>
class CrewImpl final : public AdapterImpl<C> {
 public:
  Sample run(Workload w, std::size_t tasks) override {
    if (w == Workload::long_deadline) return run_long_deadline<C>(tasks);
    if (w == Workload::queue_deadline) return run_queue_deadline<C>(tasks);
    if (is_fork_join(w)) return run_crew_fork_join(w);  // crew_forkjoin.cpp
    if (w == Workload::three_pools) return run_pools<C, 3>(tasks);
    if (w == Workload::one_pool) return run_pools<C, 1>(tasks);
    if (w == Workload::group_wait || w == Workload::funcpool_invoke ||
        w == Workload::parallel_for) {
      return run_crew_structured(w, tasks);  // crew_structured.cpp
    }
    return AdapterImpl<C>::run(w, tasks);
  }
};

double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t size_pages = 0;
  std::size_t resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return static_cast<double>(resident_pages) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

std::chrono::nanoseconds process_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// Runs some work first so the workers exist (a default pool starts them on
// demand), then measures the idle window that follows, spin-down included.
IdleCpu idle_cpu_of(std::string config, crew::PoolOptions options, double seconds) {
  crew::Pool pool(std::move(options));
  Counter done;
  constexpr std::uint64_t kWarmTasks = 10'000;
  for (std::uint64_t i = 0; i < kWarmTasks; ++i) {
    expect_accepted(pool.post([&done]() noexcept { done.fetch_add(1); }));
  }
  wait_for_value(done, kWarmTasks);
  pool.wait_idle();

  const auto wall_start = std::chrono::steady_clock::now();
  const auto cpu_start = process_cpu_time();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const auto cpu = process_cpu_time() - cpu_start;
  const auto wall = std::chrono::steady_clock::now() - wall_start;
  return {std::move(config), seconds,
          100.0 * static_cast<double>(cpu.count()) /
              static_cast<double>(std::chrono::nanoseconds(wall).count()),
          pool.stats().workers};
}

}  // namespace

std::unique_ptr<Impl> make_crew_impl() { return std::make_unique<CrewImpl<Crew>>(); }
std::unique_ptr<Impl> make_crew_fifo_impl() { return std::make_unique<CrewImpl<CrewFifo>>(); }
std::unique_ptr<Impl> make_crew_priority_impl() {
  return std::make_unique<CrewImpl<CrewPriority>>();
}
std::unique_ptr<Impl> make_crew_unbounded_impl() {
  return std::make_unique<CrewImpl<CrewUnbounded>>();
}
std::unique_ptr<Impl> make_crew_overload_impl() {
  return std::make_unique<CrewImpl<CrewOverload>>();
}

std::vector<IdleCpu> measure_idle_cpu(double seconds) {
  std::vector<IdleCpu> out;
  out.push_back(idle_cpu_of("default", idle_options(0), seconds));
  out.push_back(idle_cpu_of("min_workers_2", idle_options(kWorkers), seconds));
  return out;
}

// On an unbounded queue: a paused pool with a bounded one would block.
QueuedMemory measure_queued_memory(std::size_t tasks) {
  CrewUnbounded c;
  prime(c);
  crew::Pool& pool = c.pool;
  pool.pause();
  malloc_trim(0);  // so freed heap is not silently reused and hidden
  Counter done;
  const double rss_before = resident_bytes();
  const Sample post = timed(tasks, [&] {
    for (std::size_t i = 0; i < tasks; ++i) {
      expect_accepted(pool.post([&done]() noexcept { done.fetch_add(1); }));
    }
  });
  const double added = resident_bytes() - rss_before;
  pool.resume();
  wait_for_value(done, tasks);
  pool.wait_idle();
  const double n = static_cast<double>(std::max<std::size_t>(tasks, 1));
  return {tasks, added / (1024.0 * 1024.0), added / n, post.allocs_per_task, post.ns_per_task};
}

// Posts in batches the workers drain before the next one, so the queue stays
// within its preallocated lock-free ring (beyond 65,536 queued tasks crew
// spills to a growing deque, which is not the steady state). Unbounded, so
// that a batch never blocks on a full queue.
PostAllocs measure_post_allocs(std::size_t tasks) {
  constexpr std::size_t kBatch = 4096;
  CrewUnbounded c;
  Counter done;
  std::uint64_t a = 1, b = 2, d = 3, e = 4, f = 5;
  auto task = [counter = &done, a, b, d, e, f]() noexcept {
    counter->fetch_add((a + b + d + e + f) / 15, std::memory_order_release);
  };
  static_assert(sizeof(task) == 48, "the spec's 48-byte callable");

  auto post_all = [&] {
    for (std::size_t posted = 0; posted < tasks;) {
      const std::size_t batch = std::min(kBatch, tasks - posted);
      for (std::size_t i = 0; i < batch; ++i) c.post(task);
      posted += batch;
      wait_for_value(done, posted);
    }
  };
  post_all();  // warm-up: workers started, thread-local caches filled
  done.store(0);
  const Sample s = timed(tasks, post_all);
  return {tasks, sizeof(task), s.allocs_per_task, s.ns_per_task};
}

}  // namespace bench

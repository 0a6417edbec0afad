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

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
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
#include "impl.hpp"

namespace bench {

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
  Counter done;
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
  Counter done;
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
  Counter next;
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
  Counter done;
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
  Counter sum;
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
  Counter done;
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

// ---- latency ----

// q-quantile (0..1) of v, reordering v.
inline double quantile_us(std::vector<std::int64_t>& v, double q) {
  if (v.empty()) return 0;
  const auto k =
      std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return static_cast<double>(v[k]) / 1000.0;
}

// Writes a latency run's tasks to buffers.trace_path, one line each, in
// the order sent: the intended send time (us from the first one), the
// scheduling latency (start minus post(), us), how late the producer
// called post() (us) and the CPU the task started on. Expects post_ns and
// start_ns as latencies (see run_latency); a file that cannot be written
// fails the run.
// The first line gives the first intended time in steady_clock (on Linux
// CLOCK_MONOTONIC) nanoseconds, to line the trace up with `perf record -k
// mono`.
inline void write_latency_trace(const LatencyBuffers& b, std::int64_t t0_ns, double period_ns) {
  std::FILE* f = std::fopen(b.trace_path.c_str(), "w");
  if (f == nullptr) fail(("cannot write the latency trace " + b.trace_path).c_str());
  std::fprintf(f, "# t0_ns %lld\n", static_cast<long long>(t0_ns));
  std::fprintf(f, "# intended_us\tsched_us\tproducer_late_us\tcpu\n");
  for (std::size_t i = 0; i < b.post_ns.size(); ++i) {
    const double sched = static_cast<double>(b.post_ns[i]) / 1e3;
    const double late = static_cast<double>(b.start_ns[i] - b.post_ns[i]) / 1e3;
    std::fprintf(f, "%.3f\t%.3f\t%.3f\t%u\n", static_cast<double>(i) * period_ns / 1e3, sched, late,
                 static_cast<unsigned>(b.cpu[i]));
  }
  if (std::fclose(f) != 0) fail(("cannot write the latency trace " + b.trace_path).c_str());
}

// Context switches of the process so far: voluntary, involuntary.
inline std::pair<long, long> context_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_nvcsw, u.ru_nivcsw};
}

// The producer's loop of run_latency; kTrace: each task also notes its CPU.
// The producer is the calling thread. It busy-waits until each task's
// intended time (at 100k tasks/s the gap is 10 us, below what a sleep can
// hit), records the time and posts. Latency is taken from the intended time,
// so time the producer spends blocked in post() delays every later task and
// is counted; the scheduling latency is taken from the post() call.
template <bool kTrace, class A, class Intended>
void send_at_intended_times(A& pool, std::size_t n, const Intended& intended,
                            LatencyBuffers& buffers, Counter& done) {
  std::int64_t* const post_at = buffers.post_ns.data();
  std::int64_t* const start_at = buffers.start_ns.data();
  [[maybe_unused]] std::uint16_t* const cpu_of = buffers.cpu.data();
  pool.produce([&] {
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t due = intended(i);
      std::int64_t t = now_ns();
      while (t < due) {
        cpu_relax();
        t = now_ns();
      }
      post_at[i] = t;
      if constexpr (kTrace) {
        pool.post([start_at, cpu_of, i, &done]() noexcept {
          start_at[i] = now_ns();
          cpu_of[i] = static_cast<std::uint16_t>(sched_getcpu());
          done.fetch_add(1, std::memory_order_release);
        });
      } else {
        pool.post([start_at, i, &done]() noexcept {  // the task as without a trace
          start_at[i] = now_ns();
          done.fetch_add(1, std::memory_order_release);
        });
      }
    }
  });
  wait_for_value(done, n);
}

// One run at spec.rate for spec.seconds on a fresh pool of A: percentiles
// from the intended times and from post(), the process's context switches
// per second, and with buffers.trace_path the trace of every task.
template <class A>
LatencySample run_latency(const LatencySpec& spec, LatencyBuffers& buffers) {
  const auto n = static_cast<std::size_t>(spec.rate * spec.seconds);
  buffers.prepare(n);
  A pool;
  prime(pool);
  std::int64_t* const post_at = buffers.post_ns.data();
  std::int64_t* const start_at = buffers.start_ns.data();
  Counter done;
  const double period_ns = 1e9 / spec.rate;
  auto intended = [t0 = now_ns() + 1'000'000, period_ns](std::size_t i) {
    return t0 + static_cast<std::int64_t>(static_cast<double>(i) * period_ns);
  };
  const auto switches_before = context_switches();
  if (!buffers.trace_path.empty()) {
    send_at_intended_times<true>(pool, n, intended, buffers, done);
  } else {
    send_at_intended_times<false>(pool, n, intended, buffers, done);
  }
  const auto switches_after = context_switches();

  std::int64_t last_start = intended(0);
  for (std::size_t i = 0; i < n; ++i) {
    if (start_at[i] == 0) fail("latency: a task did not record its start");
    last_start = std::max(last_start, start_at[i]);
    post_at[i] = start_at[i] - post_at[i];  // now: scheduling latency
    start_at[i] -= intended(i);             // now: latency from the intended time
  }
  LatencySample s;
  s.rate = spec.rate;
  const double seconds = static_cast<double>(last_start - intended(0)) * 1e-9 + period_ns * 1e-9;
  s.achieved_rate = static_cast<double>(n) / seconds;
  if (!buffers.trace_path.empty()) write_latency_trace(buffers, intended(0), period_ns);
  s.p50_us = quantile_us(buffers.start_ns, 0.5);
  s.p99_us = quantile_us(buffers.start_ns, 0.99);
  s.p999_us = quantile_us(buffers.start_ns, 0.999);
  s.sched_p50_us = quantile_us(buffers.post_ns, 0.5);
  s.sched_p99_us = quantile_us(buffers.post_ns, 0.99);
  s.sched_p999_us = quantile_us(buffers.post_ns, 0.999);
  s.voluntary_switches_per_s =
      static_cast<double>(switches_after.first - switches_before.first) / seconds;
  s.involuntary_switches_per_s =
      static_cast<double>(switches_after.second - switches_before.second) / seconds;
  return s;
}

inline LatencySample Impl::run_latency(const LatencySpec&, LatencyBuffers&) {
  fail("this implementation does not run the latency workload");
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
  [[nodiscard]] bool runs_latency() const override {
    if constexpr (requires { A::kLatency; }) {
      return A::kLatency;
    } else {
      return false;
    }
  }
  LatencySample run_latency(const LatencySpec& spec, LatencyBuffers& buffers) override {
    return bench::run_latency<A>(spec, buffers);
  }

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
      case Workload::fib:
      case Workload::skynet:
      case Workload::nqueens:
      case Workload::matmul:
        if constexpr (requires { A::run_fork_join(w); }) return A::run_fork_join(w);
        break;
      case Workload::long_deadline:
      case Workload::queue_deadline:
      case Workload::group_wait:
      case Workload::funcpool_invoke:
      case Workload::parallel_for:
      case Workload::three_pools:
      case Workload::one_pool:
        break;
    }
    fail("workload not supported by this implementation");
  }
};

}  // namespace bench

// bench/cpu_gaps.hpp: the machine's CPU-availability gaps.
#include "cpu_gaps.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace bench {
namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The CPUs this process may run on.
std::vector<std::size_t> allowed_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  std::vector<std::size_t> cpus;
  for (std::size_t c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  return cpus;
}

void pin_calling_thread(std::size_t cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

CpuGaps measure_cpu_gaps(double seconds) {
  const std::vector<std::size_t> cpus = allowed_cpus();
  if (cpus.empty()) return {};
  const auto span = static_cast<std::int64_t>(seconds * 1e9);
  std::vector<std::vector<std::int64_t>> gaps(cpus.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    threads.emplace_back([&, i] {
      pin_calling_thread(cpus[i]);
      const std::int64_t start = now_ns();
      std::int64_t last = start;
      for (std::int64_t t = start; t - start < span; t = now_ns()) {
        if (t - last > kMinGapNs) gaps[i].push_back(t - last);
        last = t;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CpuGaps g;
  g.cpus = cpus.size();
  g.seconds = seconds;
  std::vector<std::int64_t> all;
  double away_ns = 0;
  for (const auto& v : gaps) {
    all.insert(all.end(), v.begin(), v.end());
    for (const std::int64_t x : v) away_ns += static_cast<double>(x);
  }
  if (g.cpus == 0) return g;
  const double cpu_ns = static_cast<double>(span) * static_cast<double>(g.cpus);
  g.per_ms = static_cast<double>(all.size()) / (cpu_ns / 1e6);
  g.away_percent = 100.0 * away_ns / cpu_ns;
  std::sort(all.begin(), all.end());
  if (!all.empty()) {
    g.p50_us = static_cast<double>(all[all.size() / 2]) / 1e3;
    g.p99_us = static_cast<double>(all[all.size() * 99 / 100]) / 1e3;
    g.max_us = static_cast<double>(all.back()) / 1e3;
  }
  return g;
}

double cross_core_round_trip_ns() {
  const std::vector<std::size_t> cpus = allowed_cpus();
  if (cpus.size() < 2) return 0;
  // Odd values are the first thread's turn to be answered, even the second's.
  alignas(64) std::atomic<int> ball{0};
  std::int64_t start = 0;
  std::int64_t stop = 0;
  std::thread first([&] {
    pin_calling_thread(cpus[0]);
    start = now_ns();
    for (int i = 0; i < kCrossCoreTrips; ++i) {
      ball.store(2 * i + 1, std::memory_order_release);
      while (ball.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    stop = now_ns();
  });
  std::thread second([&] {
    pin_calling_thread(cpus[1]);
    for (int i = 0; i < kCrossCoreTrips; ++i) {
      while (ball.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      ball.store(2 * i + 2, std::memory_order_release);
    }
  });
  first.join();
  second.join();
  return static_cast<double>(stop - start) / kCrossCoreTrips;
}

CpuGaps median_of(const std::vector<CpuGaps>& runs) {
  CpuGaps m;
  if (runs.empty()) return m;
  std::vector<double> per_ms, away, p50;
  for (const CpuGaps& g : runs) {
    per_ms.push_back(g.per_ms);
    away.push_back(g.away_percent);
    p50.push_back(g.p50_us);
    m.p99_us = std::max(m.p99_us, g.p99_us);
    m.max_us = std::max(m.max_us, g.max_us);
  }
  m.cpus = runs.front().cpus;
  m.seconds = runs.front().seconds;
  m.per_ms = median(per_ms);
  m.away_percent = median(away);
  m.p50_us = median(p50);
  return m;
}

}  // namespace bench

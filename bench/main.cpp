// crew_bench: crew's worker pool against oneTBB, Boost.Asio's thread_pool and
// Debian's libthread-pool, all with 2 workers (the reference machine has 2
// cores). Run with --help for the options; `make bench` runs it and
// bench/report.py turns its JSON into docs/bench/results.md and a plot.
//
// Method
//  * Interleaving. Cross-core costs on a shared (virtual) machine drift 2-3x
//    over minutes, so running one implementation to completion and then the
//    next would mostly measure the drift. Instead every (implementation,
//    workload) pair runs once per round, for R rounds, in an order rotated
//    each round (workloads rotate, and implementations rotate within a
//    workload, so a competitor's run sits next to crew's). One warm-up round
//    runs first and is discarded.
//  * Medians. Each pair reports the median ns/task over rounds (plus min and
//    max). crew's ratio to a competitor is computed per round, from the two
//    runs of the same round, and its median reported: it cancels drift that
//    is slow compared with a round.
//  * Fresh pools. Every measurement builds its own pool, primes it with a
//    few tasks and only then starts the clock; destruction is not timed.
//    Completion is detected on the tasks' own counter (or task_group::wait,
//    or each handle's get()).
//  * Allocation counting. alloc_count.cpp replaces malloc/calloc/realloc,
//    the aligned C allocators and all global operator new/delete forms with
//    counting versions; the allocations of all threads during the timed
//    region divided by the number of tasks give allocs/task. Counting costs
//    a few ns per allocation in every implementation. TBB's allocations
//    through libtbbmalloc cannot be seen (noted in the output).
//  * The machine's state. Before each workload's runs in a round, two
//    threads pinned to two CPUs pass a cache line back and forth
//    (cross_core_round_trip_ns, cpu_gaps.hpp): on a virtual machine that
//    places its CPUs close together or far apart by turns, this says which
//    a round ran in. The JSON has it per round; when it moved by more than
//    2x, the table is followed by the crew/impl ratios of the near and the
//    far rounds apart.
//  * Shared counters. The counter a workload's tasks add to is alone on its
//    cache line (harness.hpp, Counter).
//  * Configuration. Every crew row is a pool with default PoolOptions but
//    for kWorkers workers (min and max), so the default bounded queue is
//    what the table shows; variants are extra rows named for what they
//    change (crew_unbounded: queue_capacity = kUnbounded).
//
// Workloads (harness.hpp and the files named there): short_detached,
// short_future, producers_4, factorial (1,000,000 tiny tasks by default,
// fire-and-forget or with handles); long_deadline, queue_deadline,
// group_wait, funcpool_invoke, parallel_for (crew's other entry points); three_pools
// and one_pool (three pools of one process fed by a producer each, against
// one pool fed by three producers: the same work); and
//  * fork-join (forkjoin.hpp): fib, skynet, nqueens, matmul, one task per
//    call of the recursion, for crew (a Group per node), crew_task (Task
//    handles) and tbb_task_group; sizes by --fj-size. Each measurement runs
//    the workload once untimed, then timed, and checks both results;
//    ns/task is time x threads / tasks. crew's measurements run in a child
//    process (isolate.hpp), so a crash (a worker overflowing its stack) is
//    reported in the row and the benchmark goes on. After the rounds, one
//    more run per pair measures the deepest stack a thread reached
//    (stack_kib).
//  * latency (harness.hpp, run_latency): one producer posts tasks at
//    intended times for --latency-seconds at each target rate; each task
//    records its start time. Percentiles of the start minus the intended
//    time (a producer that falls behind is charged: coordinated omission)
//    and minus the post() call (the pool's share). Before the rounds a
//    search finds the highest rate crew sustains (achieved >= 0.95 x
//    target over 1 s runs), which joins the rates of the rounds. Before
//    each round's latency runs, cpu_gaps.hpp measures how often and how
//    long the machine takes each CPU away, and impl polling_thread (one
//    thread polling a single-producer ring, never sleeping) runs in the
//    rounds beside the pools: the floor of any pool's tail on the machine.
//    Each run also counts the process's context switches (voluntary: a
//    thread blocked, so a wake-up follows; involuntary: preempted or
//    yielded), and with --latency-trace writes its tasks one per line, for
//    bench/latency_clusters.py to find the stalls that make the tail.
//
// Google Benchmark is not used: it runs each benchmark to completion before
// starting the next, so it cannot interleave rounds across implementations,
// and its iteration-count heuristics would make every run a different size.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu_gaps.hpp"
#include "crew_extras.hpp"
#include "forkjoin.hpp"
#include "harness.hpp"
#include "options.hpp"
#include "results.hpp"

namespace bench {
namespace {

bool selected(const std::vector<std::string>& filter, std::string_view name) {
  return filter.empty() || std::find(filter.begin(), filter.end(), name) != filter.end();
}

std::vector<std::unique_ptr<Impl>> make_impls(const Options& o) {
  std::vector<std::unique_ptr<Impl>> all;
  all.push_back(make_crew_impl());
  all.push_back(make_crew_unbounded_impl());
  all.push_back(make_crew_overload_impl());
  all.push_back(make_crew_fifo_impl());
  all.push_back(make_crew_priority_impl());
#ifdef CREW_BENCH_METRICS
  all.push_back(make_crew_metrics_impl());
  all.push_back(make_crew_null_observer_impl());
#endif
  all.push_back(make_crew_task_impl());
  all.push_back(make_tbb_enqueue_impl());
  all.push_back(make_tbb_task_group_impl());
  all.push_back(make_tbb_parallel_for_impl());
  all.push_back(make_asio_impl());
  all.push_back(make_thread_pool_deb_impl());
  all.push_back(make_polling_thread_impl());
  for (const std::string& want : o.impls) {
    if (std::none_of(all.begin(), all.end(), [&](const auto& i) { return i->name() == want; })) {
      usage_error("unknown implementation: " + want);
    }
  }
  std::erase_if(all, [&](const auto& i) { return !selected(o.impls, i->name()); });
  return all;
}

std::vector<Workload> make_workloads(const Options& o) {
  for (const std::string& want : o.workloads) {
    if (want != kLatency && std::none_of(kWorkloads.begin(), kWorkloads.end(),
                                         [&](Workload w) { return name_of(w) == want; })) {
      usage_error("unknown workload: " + want);
    }
  }
  std::vector<Workload> out;
  for (Workload w : kWorkloads) {
    if (selected(o.workloads, name_of(w))) out.push_back(w);
  }
  return out;
}

template <class T>
std::vector<T> rotated(std::vector<T> v, std::size_t by) {
  if (!v.empty())
    std::rotate(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(by % v.size()), v.end());
  return v;
}

// ---- the interleaved rounds ----

struct Series {
  Impl* impl = nullptr;
  Workload workload{};
  std::vector<Sample> rounds;  // in round order, failed runs included
};

using SeriesKey = std::pair<std::string_view, Workload>;
using LatencyKey = std::pair<std::string_view, double>;  // impl, target rate
using LatencySeries = std::map<LatencyKey, std::vector<LatencySample>>;

// One pass over every supported pair, in this round's rotated order, then
// the latency runs (rates rotated, implementations rotated within a rate).
void run_round(const std::vector<Impl*>& impls, const std::vector<Workload>& workloads,
               const std::vector<Impl*>& latency_impls, const std::vector<double>& rates,
               const Options& o, std::size_t round, std::map<SeriesKey, Series>* record,
               LatencySeries* latency, LatencyBuffers& buffers) {
  for (Workload w : rotated(workloads, round)) {
    const double cross_core_ns = cross_core_round_trip_ns();
    for (Impl* impl : rotated(impls, round)) {
      if (!impl->skip_reason(w).empty()) continue;
      Sample s = impl->run(w, o.tasks);
      s.cross_core_ns = cross_core_ns;
      if (record != nullptr) {
        Series& series = (*record)[{impl->name(), w}];
        series.impl = impl;
        series.workload = w;
        series.rounds.push_back(s);
      }
    }
  }
  for (double rate : rotated(rates, round)) {
    for (Impl* impl : rotated(latency_impls, round)) {
      if (!o.latency_trace.empty() && latency != nullptr) {
        buffers.trace_path = o.latency_trace + "/latency-" + std::string(impl->name()) + "-" +
                             std::to_string(static_cast<long long>(rate)) + "-r" +
                             std::to_string(round + 1) + ".tsv";
      }
      const LatencySample s = impl->run_latency({rate, o.latency_seconds}, buffers);
      buffers.trace_path.clear();
      if (latency != nullptr) (*latency)[{impl->name(), rate}].push_back(s);
    }
  }
}

// The highest rate at which crew's achieved rate is at least kSustained x
// the target: doubling from kSearchStart up to kSearchCap, then three
// bisection steps. A result of kSearchCap means "at least".
RateSearch search_max_rate(Impl& crew, LatencyBuffers& buffers) {
  RateSearch out;
  auto sustained = [&](double rate) {
    const LatencySample s = crew.run_latency({rate, kSearchSeconds}, buffers);
    out.trials.emplace_back(rate, s.achieved_rate);
    std::fprintf(stderr, "crew_bench: latency search: %.0f tasks/s -> achieved %.0f\n", rate,
                 s.achieved_rate);
    return s.achieved_rate >= kSustained * rate;
  };
  double good = 0, bad = 0;
  for (double r = kSearchStart; good < kSearchCap; r = std::min(r * 2, kSearchCap)) {
    if (!sustained(r)) {
      bad = r;
      break;
    }
    good = r;
  }
  for (int step = 0; step < 3 && bad > 0; ++step) {
    const double mid = good > 0 ? (good + bad) / 2 : bad / 2;
    (sustained(mid) ? good : bad) = mid;
  }
  out.max_rate = std::floor(good / 10'000) * 10'000;  // a round figure, still sustained
  return out;
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const std::string& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

std::vector<Summary> summarize(const std::map<SeriesKey, Series>& all,
                               const std::map<std::string_view, std::size_t>& threads,
                               const std::map<SeriesKey, Sample>& stacks) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  std::vector<Summary> out;
  for (const auto& [key, series] : all) {
    Summary s;
    s.impl = std::string(key.first);
    s.workload = key.second;
    std::vector<double> ok, allocs;
    std::set<std::string> reasons;
    for (const Sample& r : series.rounds) {
      s.cross_core_ns.push_back(r.cross_core_ns);
      if (!r.failure.empty()) {
        ++s.failed;
        reasons.insert(r.failure);
        s.ns.push_back(kNaN);
        continue;
      }
      s.ns.push_back(r.ns_per_task);
      ok.push_back(r.ns_per_task);
      allocs.push_back(r.allocs_per_task);
    }
    s.failure = join(reasons);
    if (!ok.empty()) {
      s.ns_median = median(ok);
      s.ns_min = *std::min_element(ok.begin(), ok.end());
      s.ns_max = *std::max_element(ok.begin(), ok.end());
      s.allocs_median = median(allocs);
    }
    // Fork-join runs on kWorkers threads everywhere (tbb_task_group's arena
    // included); the count measured per impl is for the flat workloads.
    s.executing_threads = is_fork_join(key.second) ? kWorkers : threads.at(key.first);
    s.alloc_note = std::string(series.impl->alloc_note());
    if (const auto st = stacks.find(key); st != stacks.end()) s.stack = st->second;
    const auto crew = all.find({"crew", key.second});
    if (key.first != "crew" && crew != all.end()) {
      for (std::size_t r = 0; r < series.rounds.size(); ++r) {
        const Sample& c = crew->second.rounds[r];
        const Sample& x = series.rounds[r];
        if (c.failure.empty() && x.failure.empty()) {
          s.crew_ratios.push_back(c.ns_per_task / x.ns_per_task);
          s.ratio_cross_core_ns.push_back(x.cross_core_ns);
        }
      }
      if (!s.crew_ratios.empty()) s.crew_ratio_median = median(s.crew_ratios);
    }
    out.push_back(std::move(s));
  }
  // Table order: workloads as declared, crew first within each.
  std::stable_sort(out.begin(), out.end(), [](const Summary& a, const Summary& b) {
    if (a.workload != b.workload) return a.workload < b.workload;
    return (a.impl == "crew") > (b.impl == "crew");
  });
  return out;
}

std::vector<LatencySummary> summarize_latency(const LatencySeries& all) {
  std::vector<LatencySummary> out;
  for (const auto& entry : all) {
    // Not a structured binding: clang 14 cannot capture one in a lambda.
    const auto& key = entry.first;
    const auto& runs = entry.second;
    LatencySummary s;
    s.impl = std::string(key.first);
    s.rate = key.second;
    auto med = [&runs](double LatencySample::*field) {
      std::vector<double> v;
      for (const LatencySample& r : runs) v.push_back(r.*field);
      return median(v);
    };
    s.median.rate = key.second;
    s.median.achieved_rate = med(&LatencySample::achieved_rate);
    s.median.p50_us = med(&LatencySample::p50_us);
    s.median.p99_us = med(&LatencySample::p99_us);
    s.median.p999_us = med(&LatencySample::p999_us);
    s.median.sched_p50_us = med(&LatencySample::sched_p50_us);
    s.median.sched_p99_us = med(&LatencySample::sched_p99_us);
    s.median.sched_p999_us = med(&LatencySample::sched_p999_us);
    s.median.voluntary_switches_per_s = med(&LatencySample::voluntary_switches_per_s);
    s.median.involuntary_switches_per_s = med(&LatencySample::involuntary_switches_per_s);
    for (const LatencySample& r : runs) s.sched_p99_rounds.push_back(r.sched_p99_us);
    const auto crew = all.find({"crew", key.second});
    if (key.first != "crew" && crew != all.end()) {
      for (std::size_t r = 0; r < runs.size() && r < crew->second.size(); ++r) {
        if (runs[r].sched_p99_us > 0) {
          s.crew_sched_p99_ratios.push_back(crew->second[r].sched_p99_us / runs[r].sched_p99_us);
        }
      }
      if (!s.crew_sched_p99_ratios.empty()) {
        s.crew_sched_p99_ratio_median = median(s.crew_sched_p99_ratios);
      }
    }
    out.push_back(std::move(s));
  }
  std::stable_sort(out.begin(), out.end(), [](const LatencySummary& a, const LatencySummary& b) {
    if (a.rate != b.rate) return a.rate < b.rate;
    return (a.impl == "crew") > (b.impl == "crew");
  });
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The completion matrix: every fork-join workload selected, through Group
// and through Task handles, on 1 and 2 workers, with the default and an
// unbounded queue, `runs` times each, every run in its own child process
// (a stack overflow counts as a failed run) with stack tracking on. A wrong
// result stops the benchmark (fail()). It is the whole run: the settings it
// leaves in fork_join_config() are not restored.
int run_fork_join_matrix(const Options& o) {
  ForkJoinConfig& c = fork_join_config();
  c.isolate = true;
  c.track_stack = true;
  std::printf("fork-join completion: %zu runs per cell, each a warm-up and a timed run\n\n",
              o.fj_matrix);
  std::printf("%-14s %-10s %-8s %-10s %10s %12s  %s\n", "workload", "impl", "workers", "queue",
              "completed", "peak stack", "failures");
  int failed_cells = 0;
  for (Workload w : make_workloads(o)) {
    if (!is_fork_join(w)) continue;
    for (const bool task : {false, true}) {
      for (const std::size_t workers : {std::size_t{1}, std::size_t{2}}) {
        for (const bool unbounded : {false, true}) {
          c.crew_workers = workers;
          c.crew_unbounded = unbounded;
          std::size_t completed = 0;
          double stack_kib = 0;
          std::map<std::string, int> failures;
          for (std::size_t r = 0; r < o.fj_matrix; ++r) {
            const Sample s = task ? run_crew_task_fork_join(w) : run_crew_fork_join(w);
            if (s.failure.empty()) {
              ++completed;
              stack_kib = std::max(stack_kib, s.stack_kib);
            } else {
              ++failures[s.failure];
            }
          }
          std::string why;
          for (const auto& [f, n] : failures) why += f + " x" + std::to_string(n) + " ";
          if (completed != o.fj_matrix) ++failed_cells;
          std::printf("%-14s %-10s %-8zu %-10s %5zu of %-3zu %8.0f KiB  %s\n",
                      workload_label(w).c_str(), task ? "crew_task" : "crew", workers,
                      unbounded ? "unbounded" : "default", completed, o.fj_matrix, stack_kib,
                      why.c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return failed_cells == 0 ? 0 : 1;
}

int run(const Options& o) {
  if (o.fj_matrix > 0) return run_fork_join_matrix(o);
  const auto owned = make_impls(o);
  std::vector<Impl*> impls;
  for (const auto& i : owned) impls.push_back(i.get());
  const std::vector<Workload> workloads = make_workloads(o);
  const bool with_crew = selected(o.impls, "crew");
  std::vector<Impl*> latency_impls;
  if (selected(o.workloads, kLatency)) {
    for (Impl* i : impls) {
      if (i->runs_latency()) latency_impls.push_back(i);
    }
  }
  std::vector<double> rates = latency_impls.empty() ? std::vector<double>{} : o.latency_rates;
  LatencyBuffers buffers;

  Extras extras;
  if (with_crew) {
    // First, while the heap is still small: freed memory from earlier runs
    // would be reused and hide part of the growth.
    extras.queued = measure_queued_memory(o.tasks);
    // Before any TBB arena exists, whose global workers outlive it.
    if (o.idle_seconds > 0) extras.idle = measure_idle_cpu(o.idle_seconds);
  }

  std::map<std::string_view, std::size_t> threads;
  for (Impl* i : impls) threads[i->name()] = i->executing_threads();

  std::vector<Skip> skips;
  for (Workload w : workloads) {
    for (Impl* i : impls) {
      if (!i->skip_reason(w).empty()) {
        skips.push_back({std::string(i->name()), w, std::string(i->skip_reason(w))});
      }
    }
  }

  // The warm-up round leaves the latency runs out: each builds its own pool,
  // and the rate search below warms crew's.
  auto start = std::chrono::steady_clock::now();
  run_round(impls, workloads, {}, {}, o, 0, nullptr, nullptr, buffers);
  std::fprintf(stderr, "crew_bench: warm-up round took %.1f s\n", seconds_since(start));
  const auto crew = std::find_if(latency_impls.begin(), latency_impls.end(),
                                 [](Impl* i) { return i->name() == "crew"; });
  if (o.latency_search && crew != latency_impls.end()) {
    extras.rate_search = search_max_rate(**crew, buffers);
    const double max_rate = extras.rate_search->max_rate;
    if (max_rate > 0 && std::find(rates.begin(), rates.end(), max_rate) == rates.end()) {
      rates.push_back(max_rate);
    }
  }
  std::map<SeriesKey, Series> series;
  LatencySeries latency;
  for (std::size_t r = 0; r < o.rounds; ++r) {
    start = std::chrono::steady_clock::now();
    if (!latency_impls.empty()) extras.gaps.push_back(measure_cpu_gaps(kGapSeconds));
    run_round(impls, workloads, latency_impls, rates, o, r, &series, &latency, buffers);
    std::fprintf(stderr, "crew_bench: round %zu/%zu took %.1f s\n", r + 1, o.rounds,
                 seconds_since(start));
  }
  // One more run per fork-join pair, with each task noting its stack depth
  // (a branch and a thread-local compare per task, kept out of the rounds).
  std::map<SeriesKey, Sample> stacks;
  if (o.fj_stack) {
    fork_join_config().track_stack = true;
    for (Workload w : workloads) {
      if (!is_fork_join(w)) continue;
      for (Impl* i : impls) {
        if (i->skip_reason(w).empty()) stacks[{i->name(), w}] = i->run(w, o.tasks);
      }
    }
    fork_join_config().track_stack = false;
  }
  if (with_crew) {
    extras.post = measure_post_allocs(o.tasks);
    extras.shutdown = measure_shutdown_latency(5);
  }
#ifdef CREW_BENCH_METRICS
  if (selected(o.impls, "crew_metrics")) extras.scrape = measure_metrics_scrape(15);
#endif

  const std::vector<Summary> rows = summarize(series, threads, stacks);
  std::vector<LatencySummary> latency_rows = summarize_latency(latency);
  for (LatencySummary& l : latency_rows) l.threads = threads.at(l.impl);
  print_table(o, rows, latency_rows, skips, extras);
  if (!o.json_path.empty()) write_json(o.json_path, o, rows, latency_rows, skips, extras);
  return 0;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) { return bench::run(bench::parse_args(argc, argv)); }

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

namespace bench {
namespace {

struct Options {
  std::size_t tasks = 1'000'000;
  std::size_t rounds = 9;
  double idle_seconds = 5;
  std::string json_path;
  std::vector<std::string> impls;      // empty: all
  std::vector<std::string> workloads;  // empty: all ("latency" included)
  bool fj_stack = true;
  std::size_t fj_matrix = 0;  // > 0: run the completion matrix this many times
  std::vector<double> latency_rates = {100'000, 500'000, 1'000'000};
  double latency_seconds = 2;
  bool latency_search = true;
  std::string latency_trace;  // a directory; empty: no traces
};

constexpr double kSearchSeconds = 1;      // per trial of the max-rate search
constexpr double kGapSeconds = 0.5;       // the machine's CPU gaps, before each round
constexpr double kSustained = 0.95;       // achieved / target
constexpr double kSearchStart = 100'000;  // tasks/s, doubled until it fails
constexpr double kSearchCap = 8'000'000;

constexpr std::string_view kUsage =
    "usage: crew_bench [--tasks N] [--rounds R] [--json PATH] [--idle-seconds S]\n"
    "                  [--impl a,b,...] [--workload a,b,...] [--fj-size w=n,...]\n"
    "                  [--fj-stack 0|1] [--fj-isolate 0|1] [--fj-timeout S] [--fj-matrix N]\n"
    "                  [--latency-rates r,...] [--latency-seconds S] [--latency-search 0|1]\n"
    "                  [--latency-trace DIR]\n"
    "  --tasks N          tasks per measurement (default 1000000)\n"
    "  --rounds R         interleaved rounds; medians are over these (default 9)\n"
    "  --json PATH        also write the results as a JSON array\n"
    "  --idle-seconds S   idle-CPU window per configuration; 0 skips it (default 5)\n"
    "  --impl LIST        crew,crew_unbounded,crew_fifo,crew_priority,crew_metrics,\n"
    "                     crew_null_observer,crew_task,tbb_enqueue,tbb_task_group,\n"
    "                     tbb_parallel_for,asio,thread_pool_deb,polling_thread (latency\n"
    "                     only: one thread polling a ring, the machine's floor)\n"
    "  --workload LIST    short_detached,short_future,producers_4,factorial,long_deadline,\n"
    "                     queue_deadline,group_wait,funcpool_invoke,parallel_for,fib,\n"
    "                     skynet,nqueens,matmul,three_pools,one_pool,latency\n"
    "  --fj-size LIST     fork-join sizes (default fib=30,skynet=6,nqueens=11,matmul=1024)\n"
    "  --fj-stack 0|1     one more run per fork-join pair measuring stack depth (default 1)\n"
    "  --fj-isolate 0|1   crew's fork-join runs in a child process (default 1)\n"
    "  --fj-timeout S     an isolated run still going after S seconds fails (default 60)\n"
    "  --fj-matrix N      instead of the rounds: run crew (Group) and crew_task N times\n"
    "                     each on 1 and 2 workers, default and unbounded queue, at the\n"
    "                     --fj-size sizes, and count the runs that completed\n"
    "  --latency-rates L  target tasks/s of the latency workload (default\n"
    "                     100000,500000,1000000)\n"
    "  --latency-seconds S  how long the producer sends per run (default 2)\n"
    "  --latency-search 0|1 find the highest rate crew sustains first (default 1)\n"
    "  --latency-trace DIR  write each latency run's tasks to DIR/latency-IMPL-RATE-rROUND.tsv\n"
    "                     (send time, scheduling latency, producer lateness, CPU; see\n"
    "                     bench/latency_clusters.py)\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "crew_bench: " << why << "\n" << kUsage;
  std::exit(2);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::size_t parse_count(const std::string& flag, const std::string& value, std::size_t min) {
  try {
    std::size_t used = 0;
    const unsigned long long v = std::stoull(value, &used);
    if (used == value.size() && v >= min) return static_cast<std::size_t>(v);
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs an integer >= " + std::to_string(min));
}

bool parse_bool(const std::string& flag, const std::string& value) {
  if (value == "0" || value == "1") return value == "1";
  usage_error(flag + " needs 0 or 1");
}

double parse_positive(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs a number > 0");
}

void parse_fj_sizes(const std::string& value) {
  ForkJoinConfig& c = fork_join_config();
  for (const std::string& item : split_list(value)) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) usage_error("--fj-size needs NAME=N items");
    const std::string name = item.substr(0, eq);
    const auto n = static_cast<unsigned>(parse_count("--fj-size " + name, item.substr(eq + 1), 0));
    Workload w{};
    if (name == "fib") {
      w = Workload::fib;
      c.fib = n;
    } else if (name == "skynet") {
      w = Workload::skynet;
      c.skynet = n;
    } else if (name == "nqueens") {
      w = Workload::nqueens;
      c.nqueens = n;
    } else if (name == "matmul") {
      w = Workload::matmul;
      c.matmul = n;
    } else {
      usage_error("--fj-size: not a fork-join workload: " + name);
    }
    if (const std::string why = fork_join_size_error(w, n); !why.empty()) {
      usage_error("--fj-size " + why);
    }
  }
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("unknown option or missing value: " + arg);
    const std::string value = argv[++i];
    if (arg == "--tasks") {
      o.tasks = parse_count(arg, value, 1);
    } else if (arg == "--rounds") {
      o.rounds = parse_count(arg, value, 1);
    } else if (arg == "--idle-seconds") {
      try {
        o.idle_seconds = std::stod(value);
      } catch (const std::exception&) {
        usage_error("--idle-seconds needs a number");
      }
      if (o.idle_seconds < 0) usage_error("--idle-seconds must be >= 0");
    } else if (arg == "--json") {
      o.json_path = value;
    } else if (arg == "--impl") {
      o.impls = split_list(value);
    } else if (arg == "--workload") {
      o.workloads = split_list(value);
    } else if (arg == "--fj-size") {
      parse_fj_sizes(value);
    } else if (arg == "--fj-stack") {
      o.fj_stack = parse_bool(arg, value);
    } else if (arg == "--fj-matrix") {
      o.fj_matrix = parse_count(arg, value, 1);
    } else if (arg == "--fj-isolate") {
      fork_join_config().isolate = parse_bool(arg, value);
    } else if (arg == "--fj-timeout") {
      fork_join_config().timeout_seconds = static_cast<int>(parse_count(arg, value, 1));
    } else if (arg == "--latency-rates") {
      o.latency_rates.clear();
      for (const std::string& r : split_list(value)) {
        o.latency_rates.push_back(parse_positive(arg, r));
      }
    } else if (arg == "--latency-seconds") {
      o.latency_seconds = parse_positive(arg, value);
    } else if (arg == "--latency-search") {
      o.latency_search = parse_bool(arg, value);
    } else if (arg == "--latency-trace") {
      if (value.empty() || ::access(value.c_str(), W_OK | X_OK) != 0) {
        usage_error("--latency-trace: " + value + " is not a writable directory");
      }
      o.latency_trace = value;
    } else {
      usage_error("unknown option: " + arg);
    }
  }
  return o;
}

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

constexpr std::string_view kLatency = "latency";

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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
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
struct RateSearch {
  double max_rate = 0;                            // 0: not even kSearchStart
  std::vector<std::pair<double, double>> trials;  // target, achieved
};

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

struct Summary {
  std::string impl;
  Workload workload{};
  std::vector<double> ns;  // per round; NaN for a failed run
  double ns_median = 0, ns_min = 0, ns_max = 0, allocs_median = 0;
  std::vector<double> crew_ratios;          // per round both ran: crew ns / this ns
  std::vector<double> ratio_cross_core_ns;  // the cross-core round trip of those rounds
  std::optional<double> crew_ratio_median;
  std::vector<double> cross_core_ns;  // per round (Sample::cross_core_ns)
  std::size_t executing_threads = 0;
  std::string alloc_note;
  std::size_t failed = 0;       // rounds without a figure
  std::string failure;          // their reasons
  std::optional<Sample> stack;  // the stack-tracking run (fork-join)
  [[nodiscard]] bool measured() const { return failed < ns.size(); }
};

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

struct LatencySummary {
  std::string impl;
  std::size_t threads = kWorkers;  // that ran the tasks
  double rate = 0;
  LatencySample median;  // field by field over rounds
  std::vector<double> sched_p99_rounds;
  std::vector<double> crew_sched_p99_ratios;  // crew's / this, per round
  std::optional<double> crew_sched_p99_ratio_median;
};

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

// ---- output ----

std::string number(double v) {
  if (std::isnan(v)) return "null";  // a failed run
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Writes one JSON object; values are passed pre-serialized.
class JsonObject {
 public:
  JsonObject& str(std::string_view key, std::string_view v) {
    std::string quoted = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    return raw(key, quoted + "\"");
  }
  JsonObject& num(std::string_view key, double v) { return raw(key, number(v)); }
  JsonObject& nums(std::string_view key, const std::vector<double>& v) {
    std::string list = "[";
    for (std::size_t i = 0; i < v.size(); ++i) list += (i ? ", " : "") + number(v[i]);
    return raw(key, list + "]");
  }
  JsonObject& raw(std::string_view key, const std::string& v) {
    fields_ += (fields_.empty() ? "" : ", ") + ("\"" + std::string(key) + "\": ") + v;
    return *this;
  }
  [[nodiscard]] std::string text() const { return "{" + fields_ + "}"; }

 private:
  std::string fields_;
};

JsonObject base_entry(std::string_view impl, std::string_view workload, std::size_t tasks,
                      std::size_t rounds) {
  JsonObject o;
  o.str("impl", impl).str("workload", workload).num("threads", kWorkers);
  if (workload == name_of(Workload::producers_4)) o.num("producers", kProducers);
  if (workload == name_of(Workload::three_pools) || workload == name_of(Workload::one_pool)) {
    o.num("producers", 3).num("pools", workload == name_of(Workload::three_pools) ? 3 : 1);
  }
  if (workload == name_of(Workload::parallel_for)) {
    o.num("indices", static_cast<double>(kIndicesPerTask * tasks));
  }
  o.num("tasks", static_cast<double>(tasks)).num("rounds", static_cast<double>(rounds));
  return o;
}

// Fork-join rows: the workload's size and the tasks of one run.
JsonObject workload_entry(std::string_view impl, Workload w, const Options& o) {
  if (!is_fork_join(w)) return base_entry(impl, name_of(w), o.tasks, o.rounds);
  const unsigned size = fork_join_size(w);
  JsonObject e = base_entry(impl, name_of(w), fork_join_tasks(w, size), o.rounds);
  return e.num("size", size);
}

struct Extras {
  std::optional<RateSearch> rate_search;
  // The machine's CPU gaps, measured before each round's latency runs.
  std::vector<CpuGaps> gaps;
  std::vector<IdleCpu> idle;
  std::optional<QueuedMemory> queued;
  std::optional<PostAllocs> post;
  std::optional<ShutdownLatency> shutdown;
  std::optional<MetricsScrape> scrape;
};

struct Skip {
  std::string impl;
  Workload workload{};
  std::string reason;
};

void write_json(const std::string& path, const Options& o, const std::vector<Summary>& rows,
                const std::vector<LatencySummary>& latency, const std::vector<Skip>& skips,
                const Extras& extras) {
  std::vector<std::string> entries;
  for (const Summary& s : rows) {
    JsonObject e = workload_entry(s.impl, s.workload, o);
    if (s.measured()) {
      e.num("ns_per_task", s.ns_median).num("ns_per_task_min", s.ns_min);
      e.num("ns_per_task_max", s.ns_max);
      e.num("allocs_per_task", s.allocs_median);
    }
    e.nums("ns_per_task_rounds", s.ns);
    e.nums("cross_core_ns_rounds", s.cross_core_ns);
    if (is_fork_join(s.workload) && s.measured()) {
      // ns_per_task is thread time: wall time x threads / tasks.
      const double tasks =
          static_cast<double>(fork_join_tasks(s.workload, fork_join_size(s.workload)));
      e.num("ms_per_run", s.ns_median * tasks / static_cast<double>(kWorkers) / 1e6);
    }
    if (s.failed > 0)
      e.num("failed_rounds", static_cast<double>(s.failed)).str("failure", s.failure);
    if (s.stack) {
      if (s.stack->failure.empty()) {
        e.num("stack_kib", s.stack->stack_kib);
      } else {
        e.str("stack_failure", s.stack->failure);
      }
    }
    if (s.crew_ratio_median) e.num("crew_ratio_median", *s.crew_ratio_median);
    if (!s.crew_ratios.empty()) e.nums("crew_ratios", s.crew_ratios);
    e.num("executing_threads", static_cast<double>(s.executing_threads));
    if (!s.alloc_note.empty()) e.str("alloc_note", s.alloc_note);
    entries.push_back(e.text());
  }
  for (const LatencySummary& l : latency) {
    JsonObject e;
    e.str("impl", l.impl).str("workload", kLatency).num("threads", static_cast<double>(l.threads));
    e.num("rate", l.rate)
        .num("seconds", o.latency_seconds)
        .num("rounds", static_cast<double>(o.rounds));
    e.num("achieved_rate", l.median.achieved_rate);
    e.num("p50_us", l.median.p50_us)
        .num("p99_us", l.median.p99_us)
        .num("p999_us", l.median.p999_us);
    e.num("sched_p50_us", l.median.sched_p50_us).num("sched_p99_us", l.median.sched_p99_us);
    e.num("sched_p999_us", l.median.sched_p999_us).nums("sched_p99_us_rounds", l.sched_p99_rounds);
    e.num("voluntary_switches_per_s", l.median.voluntary_switches_per_s)
        .num("involuntary_switches_per_s", l.median.involuntary_switches_per_s);
    if (extras.rate_search && l.rate == extras.rate_search->max_rate) e.num("max_rate_found", 1);
    if (l.crew_sched_p99_ratio_median) {
      e.num("crew_sched_p99_ratio_median", *l.crew_sched_p99_ratio_median);
      e.nums("crew_sched_p99_ratios", l.crew_sched_p99_ratios);
    }
    entries.push_back(e.text());
  }
  if (const auto& r = extras.rate_search) {
    std::vector<double> targets, achieved;
    for (const auto& [t, a] : r->trials) {
      targets.push_back(t);
      achieved.push_back(a);
    }
    JsonObject e;
    e.str("impl", "crew").str("workload", "latency_max_rate").num("threads", kWorkers);
    e.num("rate", r->max_rate).num("seconds", kSearchSeconds).num("sustained_fraction", kSustained);
    e.nums("trial_rates", targets).nums("trial_achieved", achieved);
    entries.push_back(e.text());
  }
  if (!extras.gaps.empty()) {
    const CpuGaps g = median_of(extras.gaps);
    JsonObject e;
    e.str("impl", "machine").str("workload", "cpu_gaps").num("cpus", static_cast<double>(g.cpus));
    e.num("seconds", g.seconds).num("rounds", static_cast<double>(extras.gaps.size()));
    e.num("min_gap_us", static_cast<double>(kMinGapNs) / 1e3).num("gaps_per_ms", g.per_ms);
    e.num("away_percent", g.away_percent).num("gap_p50_us", g.p50_us);
    e.num("gap_p99_us", g.p99_us).num("gap_max_us", g.max_us);
    entries.push_back(e.text());
  }
  for (const Skip& s : skips) {
    entries.push_back(workload_entry(s.impl, s.workload, o).str("skipped", s.reason).text());
  }
  for (const IdleCpu& i : extras.idle) {
    entries.push_back(base_entry("crew", "idle_cpu", 0, 1)
                          .str("config", i.config)
                          .num("seconds", i.seconds)
                          .num("cpu_percent", i.cpu_percent)
                          .num("workers", static_cast<double>(i.workers))
                          .text());
  }
  if (const auto& q = extras.queued) {
    entries.push_back(base_entry("crew", "queued_memory", q->tasks, 1)
                          .num("rss_mb", q->rss_mb)
                          .num("bytes_per_task", q->bytes_per_task)
                          .num("allocs_per_task", q->allocs_per_task)
                          .num("post_ns_per_task", q->post_ns_per_task)
                          .text());
  }
  if (const auto& d = extras.shutdown) {
    entries.push_back(
        base_entry("crew", "shutdown_hard", d->hard_tasks, static_cast<std::size_t>(d->runs))
            .num("ms", d->hard_ms)
            .num("ms_max", d->hard_max_ms)
            .text());
    entries.push_back(
        base_entry("crew", "shutdown_soft", d->soft_tasks, static_cast<std::size_t>(d->runs))
            .num("ms", d->soft_ms)
            .num("ms_max", d->soft_max_ms)
            .num("rejected", static_cast<double>(d->soft_rejected))
            .text());
  }
  if (const auto& m = extras.scrape) {
    entries.push_back(base_entry("crew_metrics", "metrics_scrape", m->pools * m->task_names,
                                 static_cast<std::size_t>(m->runs))
                          .num("pools", static_cast<double>(m->pools))
                          .num("task_names", static_cast<double>(m->task_names))
                          .num("ms", m->ms)
                          .num("ms_max", m->ms_max)
                          .num("collect_ms", m->collect_ms)
                          .num("text_ms", m->text_ms)
                          .num("text_serializer_ms", m->text_serializer_ms)
                          .num("bytes", static_cast<double>(m->bytes))
                          .num("lines", static_cast<double>(m->lines))
                          .text());
  }
  if (const auto& p = extras.post) {
    entries.push_back(base_entry("crew", "post_allocs", p->tasks, 1)
                          .num("callable_bytes", static_cast<double>(p->callable_bytes))
                          .num("allocs_per_task", p->allocs_per_task)
                          .num("ns_per_task", p->ns_per_task)
                          .text());
  }
  std::ofstream out(path);
  out << "[\n";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out << "  " << entries[i] << (i + 1 < entries.size() ? ",\n" : "\n");
  }
  out << "]\n";
  if (!out) fail("cannot write the JSON file");
}

// A workload as the tables name it: fork-join ones with their size, "fib(30)".
std::string workload_label(Workload w) {
  std::string label(name_of(w));
  if (is_fork_join(w)) label += "(" + std::to_string(fork_join_size(w)) + ")";
  return label;
}

// The cross-core round trip measured before each workload's runs, and,
// when it moved by more than 2x during the run (a virtual machine whose
// CPUs were close together for some rounds and far apart for others), the
// crew/impl ratios split at the geometric middle of its range: a ratio can
// differ between the two.
void print_by_cross_core(const std::vector<Summary>& rows) {
  std::vector<double> all;
  for (const Summary& s : rows) {
    for (const double x : s.cross_core_ns) {
      if (x > 0) all.push_back(x);
    }
  }
  if (all.empty()) return;
  const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
  std::printf(
      "\nmachine: a cache line's round trip between two CPUs, before each workload's runs: "
      "median %.0f ns (min %.0f, max %.0f)\n",
      median(all), *lo, *hi);
  if (*hi < 2 * *lo) return;
  const double split = std::sqrt(*lo * *hi);
  std::printf("crew/impl in the rounds under / over %.0f ns (rounds)\n", split);
  for (const Summary& s : rows) {
    if (s.crew_ratios.empty()) continue;
    std::vector<double> near, far;
    for (std::size_t r = 0; r < s.crew_ratios.size(); ++r) {
      (s.ratio_cross_core_ns[r] < split ? near : far).push_back(s.crew_ratios[r]);
    }
    auto cell = [](const std::vector<double>& v) {
      char out[32] = "-";
      if (!v.empty()) std::snprintf(out, sizeof out, "%.3f (%zu)", median(v), v.size());
      return std::string(out);
    };
    std::printf("  %-15s %-18s %14s %14s\n", workload_label(s.workload).c_str(), s.impl.c_str(),
                cell(near).c_str(), cell(far).c_str());
  }
}

void print_table(const Options& o, const std::vector<Summary>& rows,
                 const std::vector<LatencySummary>& latency, const std::vector<Skip>& skips,
                 const Extras& extras) {
  std::printf("\ncrew_bench: %zu tasks per run, %zu rounds, %zu workers; medians over rounds\n",
              o.tasks, o.rounds, kWorkers);
  std::printf("crew/impl < 1 means crew is faster (median of per-round ratios)\n\n");
  std::printf("%-15s %-18s %10s %10s %10s %12s %10s %8s\n", "workload", "impl", "ns/task", "min",
              "max", "allocs/task", "crew/impl", "threads");
  Workload last = rows.empty() ? Workload{} : rows.front().workload;
  for (const Summary& s : rows) {
    if (s.workload != last) std::printf("\n");
    last = s.workload;
    char ratio[32] = "-";
    if (s.crew_ratio_median) std::snprintf(ratio, sizeof ratio, "%.3f", *s.crew_ratio_median);
    const std::string workload = workload_label(s.workload);
    if (s.measured()) {
      std::printf("%-15s %-18s %10.1f %10.1f %10.1f %12.3f %10s %8zu", workload.c_str(),
                  s.impl.c_str(), s.ns_median, s.ns_min, s.ns_max, s.allocs_median, ratio,
                  s.executing_threads);
    } else {
      std::printf("%-15s %-18s %10s %10s %10s %12s %10s %8zu", workload.c_str(), s.impl.c_str(),
                  "-", "-", "-", "-", ratio, s.executing_threads);
    }
    if (s.failed > 0)
      std::printf("  failed %zu of %zu: %s", s.failed, s.ns.size(), s.failure.c_str());
    if (s.stack) {
      if (s.stack->failure.empty()) {
        std::printf("  stack %.0f KiB", s.stack->stack_kib);
      } else {
        std::printf("  stack run: %s", s.stack->failure.c_str());
      }
    }
    std::printf("\n");
  }
  if (!latency.empty()) {
    std::printf(
        "\nlatency: one producer, %.1f s per run; us from the intended time / from post(); "
        "context switches of the process per second (voluntary: a thread blocked; "
        "involuntary: preempted or yielded)\n",
        o.latency_seconds);
    std::printf("%-10s %-16s %10s %9s %9s %9s %9s %9s %9s %10s %9s %9s\n", "rate", "impl",
                "achieved", "p50", "p99", "p99.9", "sched50", "sched99", "sched99.9", "crew/impl",
                "vol/s", "invol/s");
    for (const LatencySummary& l : latency) {
      char ratio[32] = "-";
      if (l.crew_sched_p99_ratio_median) {
        std::snprintf(ratio, sizeof ratio, "%.3f", *l.crew_sched_p99_ratio_median);
      }
      const LatencySample& m = l.median;
      std::printf("%-10.0f %-16s %10.0f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10s %9.0f %9.0f\n",
                  l.rate, l.impl.c_str(), m.achieved_rate, m.p50_us, m.p99_us, m.p999_us,
                  m.sched_p50_us, m.sched_p99_us, m.sched_p999_us, ratio,
                  m.voluntary_switches_per_s, m.involuntary_switches_per_s);
    }
  }
  print_by_cross_core(rows);
  if (!extras.gaps.empty()) {
    const CpuGaps g = median_of(extras.gaps);
    std::printf(
        "\nmachine: a thread pinned to each of %zu CPUs, %.1f s before each round's latency "
        "runs, lost its CPU %.2f times a ms for more than %.0f us (%.1f%% of the time; gap "
        "median %.1f us, p99 %.1f us, max %.0f us)\n",
        g.cpus, g.seconds, g.per_ms, static_cast<double>(kMinGapNs) / 1e3, g.away_percent, g.p50_us,
        g.p99_us, g.max_us);
  }
  if (const auto& r = extras.rate_search) {
    std::printf(
        "\nhighest rate crew sustains (achieved >= %.2f x target, %.0f s runs): %.0f tasks/s\n",
        kSustained, kSearchSeconds, r->max_rate);
  }
  if (!skips.empty()) std::printf("\nskipped:\n");
  for (const Skip& s : skips) {
    std::printf("  %-16s %-15s %s\n", s.impl.c_str(), std::string(name_of(s.workload)).c_str(),
                s.reason.c_str());
  }
  std::printf("\ncrew extras:\n");
  for (const IdleCpu& i : extras.idle) {
    std::printf("  idle_cpu       %-14s %.3f%% of one core over %.1f s (%zu workers alive)\n",
                i.config.c_str(), i.cpu_percent, i.seconds, i.workers);
  }
  if (const auto& q = extras.queued) {
    std::printf(
        "  queued_memory  %zu tasks on a paused pool: +%.1f MiB RSS (%.1f B/task), "
        "%.3f allocs/task, post %.1f ns/task\n",
        q->tasks, q->rss_mb, q->bytes_per_task, q->allocs_per_task, q->post_ns_per_task);
  }
  if (const auto& d = extras.shutdown) {
    std::printf(
        "  shutdown_hard  %zu cooperative long tasks running: hard returns in %.1f ms "
        "(median of %d, max %.1f)\n",
        d->hard_tasks, d->hard_ms, d->runs, d->hard_max_ms);
    std::printf(
        "  shutdown_soft  %zu tasks queued: soft returns in %.1f ms (median of %d, max "
        "%.1f), %llu reported rejected\n",
        d->soft_tasks, d->soft_ms, d->runs, d->soft_max_ms,
        static_cast<unsigned long long>(d->soft_rejected));
  }
  if (const auto& m = extras.scrape) {
    std::printf(
        "  metrics_scrape %zu pools x %zu task names (%zu lines): %.1f ms (median of %d, "
        "max %.1f; Collect %.1f + text %.1f; TextSerializer %.1f)\n",
        m->pools, m->task_names, m->lines, m->ms, m->runs, m->ms_max, m->collect_ms, m->text_ms,
        m->text_serializer_ms);
  }
  if (const auto& p = extras.post) {
    std::printf(
        "  post_allocs    %zu-byte callable, steady state: %.4f allocs/task, %.1f ns/task\n",
        p->callable_bytes, p->allocs_per_task, p->ns_per_task);
  }
  std::set<std::string> notes;
  for (const Summary& s : rows) {
    if (!s.alloc_note.empty() && notes.insert(s.impl).second) {
      std::printf("\nnote (%s): %s\n", s.impl.c_str(), s.alloc_note.c_str());
    }
  }
  std::fflush(stdout);
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

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
//
// Google Benchmark is not used: it runs each benchmark to completion before
// starting the next, so it cannot interleave rounds across implementations,
// and its iteration-count heuristics would make every run a different size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "crew_extras.hpp"
#include "harness.hpp"

namespace bench {
namespace {

struct Options {
  std::size_t tasks = 1'000'000;
  std::size_t rounds = 9;
  double idle_seconds = 5;
  std::string json_path;
  std::vector<std::string> impls;      // empty: all
  std::vector<std::string> workloads;  // empty: all
};

constexpr std::string_view kUsage =
    "usage: crew_bench [--tasks N] [--rounds R] [--json PATH] [--idle-seconds S]\n"
    "                  [--impl a,b,...] [--workload a,b,...]\n"
    "  --tasks N         tasks per measurement (default 1000000)\n"
    "  --rounds R        interleaved rounds; medians are over these (default 9)\n"
    "  --json PATH       also write the results as a JSON array\n"
    "  --idle-seconds S  idle-CPU window per configuration; 0 skips it (default 5)\n"
    "  --impl LIST       crew,crew_fifo,crew_priority,crew_metrics,crew_null_observer,\n"
    "                    tbb_enqueue,tbb_task_group,tbb_parallel_for,asio,thread_pool_deb\n"
    "  --workload LIST   short_detached,short_future,producers_4,factorial,long_deadline,\n"
    "                    group_wait,funcpool_invoke,parallel_for\n";

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
  all.push_back(make_crew_fifo_impl());
  all.push_back(make_crew_priority_impl());
#ifdef CREW_BENCH_METRICS
  all.push_back(make_crew_metrics_impl());
  all.push_back(make_crew_null_observer_impl());
#endif
  all.push_back(make_tbb_enqueue_impl());
  all.push_back(make_tbb_task_group_impl());
  all.push_back(make_tbb_parallel_for_impl());
  all.push_back(make_asio_impl());
  all.push_back(make_thread_pool_deb_impl());
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
    if (std::none_of(kWorkloads.begin(), kWorkloads.end(),
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
  std::vector<Sample> rounds;  // in round order
};

using SeriesKey = std::pair<std::string_view, Workload>;

// One pass over every supported pair, in this round's rotated order.
void run_round(const std::vector<Impl*>& impls, const std::vector<Workload>& workloads,
               std::size_t round, std::size_t tasks, std::map<SeriesKey, Series>* record) {
  for (Workload w : rotated(workloads, round)) {
    for (Impl* impl : rotated(impls, round)) {
      if (!impl->skip_reason(w).empty()) continue;
      const Sample s = impl->run(w, tasks);
      if (record != nullptr) {
        Series& series = (*record)[{impl->name(), w}];
        series.impl = impl;
        series.workload = w;
        series.rounds.push_back(s);
      }
    }
  }
}

struct Summary {
  std::string impl;
  Workload workload{};
  std::vector<double> ns;  // per round
  double ns_median = 0, ns_min = 0, ns_max = 0, allocs_median = 0;
  std::vector<double> crew_ratios;  // per round: crew ns / this ns
  std::optional<double> crew_ratio_median;
  std::size_t executing_threads = 0;
  std::string alloc_note;
};

std::vector<Summary> summarize(const std::map<SeriesKey, Series>& all,
                               const std::map<std::string_view, std::size_t>& threads) {
  std::vector<Summary> out;
  for (const auto& [key, series] : all) {
    Summary s;
    s.impl = std::string(key.first);
    s.workload = key.second;
    std::vector<double> allocs;
    for (const Sample& r : series.rounds) {
      s.ns.push_back(r.ns_per_task);
      allocs.push_back(r.allocs_per_task);
    }
    s.ns_median = median(s.ns);
    s.ns_min = *std::min_element(s.ns.begin(), s.ns.end());
    s.ns_max = *std::max_element(s.ns.begin(), s.ns.end());
    s.allocs_median = median(allocs);
    s.executing_threads = threads.at(key.first);
    s.alloc_note = std::string(series.impl->alloc_note());
    const auto crew = all.find({"crew", key.second});
    if (key.first != "crew" && crew != all.end()) {
      for (std::size_t r = 0; r < series.rounds.size(); ++r) {
        s.crew_ratios.push_back(crew->second.rounds[r].ns_per_task / series.rounds[r].ns_per_task);
      }
      s.crew_ratio_median = median(s.crew_ratios);
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

// ---- output ----

std::string number(double v) {
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
  if (workload == name_of(Workload::parallel_for)) {
    o.num("indices", static_cast<double>(kIndicesPerTask * tasks));
  }
  o.num("tasks", static_cast<double>(tasks)).num("rounds", static_cast<double>(rounds));
  return o;
}

struct Extras {
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
                const std::vector<Skip>& skips, const Extras& extras) {
  std::vector<std::string> entries;
  for (const Summary& s : rows) {
    JsonObject e = base_entry(s.impl, name_of(s.workload), o.tasks, o.rounds);
    e.num("ns_per_task", s.ns_median).num("ns_per_task_min", s.ns_min);
    e.num("ns_per_task_max", s.ns_max).nums("ns_per_task_rounds", s.ns);
    e.num("allocs_per_task", s.allocs_median);
    if (s.crew_ratio_median) e.num("crew_ratio_median", *s.crew_ratio_median);
    if (!s.crew_ratios.empty()) e.nums("crew_ratios", s.crew_ratios);
    e.num("executing_threads", static_cast<double>(s.executing_threads));
    if (!s.alloc_note.empty()) e.str("alloc_note", s.alloc_note);
    entries.push_back(e.text());
  }
  for (const Skip& s : skips) {
    entries.push_back(
        base_entry(s.impl, name_of(s.workload), o.tasks, o.rounds).str("skipped", s.reason).text());
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

void print_table(const Options& o, const std::vector<Summary>& rows, const std::vector<Skip>& skips,
                 const Extras& extras) {
  std::printf("\ncrew_bench: %zu tasks per run, %zu rounds, %zu workers; medians over rounds\n",
              o.tasks, o.rounds, kWorkers);
  std::printf("crew/impl < 1 means crew is faster (median of per-round ratios)\n\n");
  std::printf("%-15s %-16s %10s %10s %10s %12s %10s %8s\n", "workload", "impl", "ns/task", "min",
              "max", "allocs/task", "crew/impl", "threads");
  Workload last = rows.empty() ? Workload{} : rows.front().workload;
  for (const Summary& s : rows) {
    if (s.workload != last) std::printf("\n");
    last = s.workload;
    char ratio[32] = "-";
    if (s.crew_ratio_median) std::snprintf(ratio, sizeof ratio, "%.3f", *s.crew_ratio_median);
    std::printf("%-15s %-16s %10.1f %10.1f %10.1f %12.3f %10s %8zu\n",
                std::string(name_of(s.workload)).c_str(), s.impl.c_str(), s.ns_median, s.ns_min,
                s.ns_max, s.allocs_median, ratio, s.executing_threads);
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

int run(const Options& o) {
  const auto owned = make_impls(o);
  std::vector<Impl*> impls;
  for (const auto& i : owned) impls.push_back(i.get());
  const std::vector<Workload> workloads = make_workloads(o);
  const bool with_crew = selected(o.impls, "crew");

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

  auto start = std::chrono::steady_clock::now();
  run_round(impls, workloads, 0, o.tasks, nullptr);
  std::fprintf(stderr, "crew_bench: warm-up round took %.1f s\n", seconds_since(start));
  std::map<SeriesKey, Series> series;
  for (std::size_t r = 0; r < o.rounds; ++r) {
    start = std::chrono::steady_clock::now();
    run_round(impls, workloads, r, o.tasks, &series);
    std::fprintf(stderr, "crew_bench: round %zu/%zu took %.1f s\n", r + 1, o.rounds,
                 seconds_since(start));
  }
  if (with_crew) {
    extras.post = measure_post_allocs(o.tasks);
    extras.shutdown = measure_shutdown_latency(5);
  }
#ifdef CREW_BENCH_METRICS
  if (selected(o.impls, "crew_metrics")) extras.scrape = measure_metrics_scrape(15);
#endif

  const std::vector<Summary> rows = summarize(series, threads);
  print_table(o, rows, skips, extras);
  if (!o.json_path.empty()) write_json(o.json_path, o, rows, skips, extras);
  return 0;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) { return bench::run(bench::parse_args(argc, argv)); }

// crew_bench's output (bench/results.hpp): the JSON file and the tables.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "results.hpp"

namespace bench {
namespace {

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

}  // namespace

// A workload as the tables name it: fork-join ones with their size, "fib(30)".
std::string workload_label(Workload w) {
  std::string label(name_of(w));
  if (is_fork_join(w)) label += "(" + std::to_string(fork_join_size(w)) + ")";
  return label;
}

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

}  // namespace bench

#!/usr/bin/env python3
"""Turns crew_bench's JSON into docs/bench/results.md, the plots
docs/bench/results.png (flat workloads), docs/bench/forkjoin.png and
docs/bench/latency.png, and the benchmark summary of README.md.

    python3 bench/report.py [build/bench-results.json]

README.md gets a summary of the headline figures (SUMMARY) between
`<!-- bench-table -->` and `<!-- /bench-table -->` (a lone opening marker
gets the summary and a closing marker after it); the full tables are in
docs/bench/results.md. Python standard library only; the plot needs gnuplot.
"""

import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "bench"
README = ROOT / "README.md"
OPEN_MARK = "<!-- bench-table -->"
CLOSE_MARK = "<!-- /bench-table -->"

IMPLS = ["crew", "crew_unbounded", "crew_fifo", "crew_priority", "crew_overload",
         "crew_metrics", "crew_null_observer", "crew_task", "tbb_enqueue", "tbb_task_group",
         "tbb_parallel_for", "asio", "thread_pool_deb", "polling_thread"]
LATENCY_ONLY = {"polling_thread"}  # a reference, not a pool
FORK_JOIN = ["fib", "skynet", "nqueens", "matmul"]
WORKLOADS = ["short_detached", "short_future", "producers_4", "factorial", "long_deadline",
             "queue_deadline", "group_wait", "funcpool_invoke", "parallel_for", "three_pools", "one_pool"] + FORK_JOIN
EXTRAS = {"idle_cpu", "queued_memory", "post_allocs", "shutdown_hard", "shutdown_soft",
          "metrics_scrape", "latency", "latency_max_rate", "cpu_gaps"}
DEFAULT_TASKS, DEFAULT_ROUNDS = 1_000_000, 9
DEFAULT_FJ_SIZES = {"fib": 30, "skynet": 6, "nqueens": 11, "matmul": 1024}
DEFAULT_LATENCY_SECONDS = 2

WORKLOAD_NOTES = {
    "short_detached": "1 producer, fire-and-forget, task = one atomic add",
    "short_future": "as short_detached with a result handle per task, then get() on all",
    "producers_4": "4 producer threads, fire-and-forget",
    "factorial": "task = factorial(20) in uint64_t added to an atomic",
    "long_deadline": "crew long tasks (std::stop_token) with a 1 s deadline, none expiring",
    "queue_deadline": "short_detached with a 1 s queue deadline (TaskOptions::queue_timeout) "
                      "per task, none expiring",
    "group_wait": "short tasks submitted into a crew::Group, then one wait()",
    "funcpool_invoke": "crew::FuncPool<uint64_t>::invoke, handler = short_detached's task body",
    "parallel_for": "10 x tasks indices (10,000,000 by default), body p[i] = i on a uint32 "
                    "array; figures are per index",
    "three_pools": "three crew pools (2 workers each) in one process, one producer thread "
                   "each posting short_detached's task",
    "one_pool": "the same tasks from three producer threads into one crew pool",
}

FORK_JOIN_NOTES = {
    "fib": "binary recursion, one task per call",
    "skynet": "10-way fan-out to depth d, leaves return their index, sum checked",
    "nqueens": "one task per legal placement of the next queen, solutions counted",
    "matmul": "N x N doubles split 4 ways down to 32 x 32 blocks, two phases per node, "
              "result checked",
}

# Same-run targets: (label, workload, impl, reference workload, reference impl,
# bound on the median of the per-round ratios).
TARGETS = [
    ("group_wait / short_future (crew)", "group_wait", "crew", "short_future", "crew", 1.3),
    ("funcpool_invoke / short_detached (crew)", "funcpool_invoke", "crew", "short_detached",
     "crew", 1.0),
    ("crew parallel_for / tbb_parallel_for", "parallel_for", "crew", "parallel_for",
     "tbb_parallel_for", 1.2),
    ("short_detached with the Prometheus exporter / without (crew_metrics / crew)",
     "short_detached", "crew_metrics", "short_detached", "crew", 1.25),
] + [
    (f"{w}: crew (default queue) / crew_unbounded", w, "crew", w, "crew_unbounded", 1.2)
    for w in ("short_detached", "short_future", "factorial", "producers_4")
] + [
    (f"{w}: crew / tbb_enqueue", w, "crew", w, "tbb_enqueue", 0.5)
    for w in ("short_detached", "short_future", "factorial", "producers_4")
] + [
    ("three_pools / one_pool, time for the same work (≤ 1.25: three pools keep ≥ 0.8x "
     "the throughput)", "three_pools", "crew", "one_pool", "crew", 1.25),
] + [
    target
    for w in FORK_JOIN
    for target in ((f"{w}: crew (Group) / tbb_task_group", w, "crew", w, "tbb_task_group", 1.0),
                   (f"{w}: crew_task / tbb_task_group", w, "crew_task", w, "tbb_task_group",
                    1.0))
]



# Footnote marks of the allocation notes, in the order the tables meet them.
NOTE_MARKS = {}


def note_mark(note):
    """The superscript that marks `note` ("" for none)."""
    if not note:
        return ""
    if note not in NOTE_MARKS:
        NOTE_MARKS[note] = "¹²³⁴⁵⁶⁷⁸⁹"[len(NOTE_MARKS)]
    return NOTE_MARKS[note]

def load(path):
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list):
        sys.exit(f"report.py: {path}: expected a JSON array")
    # Counts may be written as JSON numbers with a fraction (1000000.0).
    for e in entries:
        for key in ("tasks", "rounds"):
            if isinstance(e.get(key), float) and e[key].is_integer():
                e[key] = int(e[key])
    return entries


def order_key(entry):
    workload, impl = entry["workload"], entry["impl"]
    w = WORKLOADS.index(workload) if workload in WORKLOADS else len(WORKLOADS)
    i = IMPLS.index(impl) if impl in IMPLS else len(IMPLS)
    return (w, i, workload, impl)


def split(entries):
    """(flat throughput rows, fork-join rows, skipped rows, crew-only extras), each in
    table order. Fork-join rows whose every run failed have no ns_per_task."""
    rows = [e for e in entries if e["workload"] not in EXTRAS and "ns_per_task" in e
            and e["workload"] not in FORK_JOIN]
    fork_join = [e for e in entries if e["workload"] in FORK_JOIN and "skipped" not in e]
    skips = [e for e in entries if "skipped" in e]
    extras = [e for e in entries if e["workload"] in EXTRAS]
    return (sorted(rows, key=order_key), sorted(fork_join, key=order_key),
            sorted(skips, key=order_key), extras)


def latency_rows(entries):
    rows = [e for e in entries if e["workload"] == "latency"]
    return sorted(rows, key=lambda e: (e["rate"], IMPLS.index(e["impl"])
                                       if e["impl"] in IMPLS else len(IMPLS)))


def machine():
    cpus = len(os.sched_getaffinity(0))  # what nproc prints
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpus} CPUs (nproc), {model}"


def command_for(tasks, rounds, fj_sizes, latency_seconds):
    flags = []
    if tasks != DEFAULT_TASKS:
        flags.append(f"--tasks {tasks}")
    if rounds != DEFAULT_ROUNDS:
        flags.append(f"--rounds {rounds}")
    sizes = {w: n for w, n in fj_sizes.items() if DEFAULT_FJ_SIZES.get(w) != n}
    if sizes:
        flags.append("--fj-size " + ",".join(f"{w}={n}" for w, n in sizes.items()))
    if latency_seconds not in (None, DEFAULT_LATENCY_SECONDS):
        flags.append(f"--latency-seconds {latency_seconds:g}")
    if not flags:
        return "`make bench`"
    return (f"`./build/bench/crew_bench {' '.join(flags)} --json build/bench-results.json "
            "&& python3 bench/report.py build/bench-results.json`")


def fmt_ns(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def fmt_ratio(entry):
    r = entry.get("crew_ratio_median")
    return "—" if r is None else f"{r:.2f}"


def throughput_table(rows):
    lines = [
        "| workload | impl | median ns/task | min – max | allocs/task | crew/impl |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for e in rows:
        impl = f"**{e['impl']}**" if e["impl"] == "crew" else e["impl"]
        if e.get("executing_threads", 2) != 2:
            impl += f" ({e['executing_threads']} threads)"
        allocs = f"{e['allocs_per_task']:.2f}" + note_mark(e.get("alloc_note"))
        lines.append(f"| {e['workload']} | {impl} | {fmt_ns(e['ns_per_task'])} | "
                     f"{fmt_ns(e['ns_per_task_min'])} – {fmt_ns(e['ns_per_task_max'])} | "
                     f"{allocs} | {fmt_ratio(e)} |")
    return lines


def target_lines(rows):
    """One bullet per target whose two series are in the results."""
    by_key = {(e["workload"], e["impl"]): e for e in rows}
    lines = []
    for label, workload, impl, ref_workload, ref_impl, bound in TARGETS:
        a, b = by_key.get((workload, impl)), by_key.get((ref_workload, ref_impl))
        if a is None or b is None:
            continue
        # The machine's state in each round: the cross-core round trip measured
        # before the workload's runs (a VM's CPUs close together or far apart).
        cross = a.get("cross_core_ns_rounds") or []
        pairs = [(x / y, cross[i] if i < len(cross) else None)
                 for i, (x, y) in enumerate(zip(a["ns_per_task_rounds"], b["ns_per_task_rounds"]))
                 if x is not None and y is not None]
        if not pairs:
            lines.append(f"- {label}: no round where both ran (target ≤ {bound:g}, missed)")
            continue
        median = statistics.median(r for r, _ in pairs)
        verdict = "met" if median <= bound else "missed"
        lines.append(f"- {label}: median {median:.2f} (target ≤ {bound:g}, {verdict}); "
                     "per round (cross-core round trip): " +
                     ", ".join(f"{r:.2f}" + (f" ({c:.0f} ns)" if c else "") for r, c in pairs))
    return lines


def skip_lines(skips):
    """One bullet per (workload, reason), listing the implementations it skips;
    an implementation that runs the latency workload only (LATENCY_ONLY) gets
    one bullet for all of them."""
    grouped = {}
    latency_only = {}
    for e in skips:
        if e["impl"] in LATENCY_ONLY:
            latency_only[e["impl"]] = e["skipped"]
            continue
        grouped.setdefault((e["workload"], e["skipped"]), []).append(e["impl"])
    return ([f"- {workload} for {', '.join(impls)}: {reason}"
             for (workload, reason), impls in grouped.items()] +
            [f"- every workload but latency for {impl}: {reason}"
             for impl, reason in latency_only.items()])


def extras_lines(extras):
    lines = []
    for e in extras:
        if e["workload"] == "idle_cpu":
            lines.append(f"- idle_cpu ({e['config']}): {e['cpu_percent']:.3f} % of one core "
                         f"over {e['seconds']:g} s with {e['workers']} idle workers")
        elif e["workload"] == "queued_memory":
            lines.append(f"- queued_memory: {e['tasks']:,} small tasks queued on a paused pool "
                         f"add {e['rss_mb']:.1f} MiB RSS ({e['bytes_per_task']:.0f} B/task, "
                         f"{e['allocs_per_task']:.3f} allocs/task)")
        elif e["workload"] == "shutdown_hard":
            lines.append(f"- shutdown_hard: `shutdown(hard)` with {e['tasks']:,} cooperative long "
                         f"tasks running returns in {e['ms']:.1f} ms (median of {e['rounds']}, "
                         f"max {e['ms_max']:.1f})")
        elif e["workload"] == "shutdown_soft":
            lines.append(f"- shutdown_soft: `shutdown(soft)` with {e['tasks']:,} tasks queued "
                         f"returns in {e['ms']:.1f} ms (median of {e['rounds']}, max "
                         f"{e['ms_max']:.1f}) and reports {e['rejected']:,.0f} rejected")
        elif e["workload"] == "metrics_scrape":
            lines.append(f"- metrics_scrape: crew_metrics with {e['pools']:.0f} pools x "
                         f"{e['task_names']:.0f} task names ({e['lines']:,.0f} lines): Collect() + "
                         f"`crew::text_exposition` take {e['ms']:.1f} ms (median of {e['rounds']}; "
                         f"prometheus::TextSerializer alone {e['text_serializer_ms']:.1f} ms)")
        elif e["workload"] == "latency_max_rate":
            trials = ", ".join(f"{t:,.0f} → {a:,.0f}"
                               for t, a in zip(e["trial_rates"], e["trial_achieved"]))
            lines.append(f"- latency_max_rate: the highest rate crew sustains (achieved ≥ "
                         f"{e['sustained_fraction']:g} x target over {e['seconds']:g} s runs) is "
                         f"{e['rate']:,.0f} tasks/s; trials (target → achieved): {trials}")
        elif e["workload"] == "cpu_gaps":
            lines.append(f"- cpu_gaps (the machine, measured before each round's latency runs): "
                         f"a thread pinned to each of {e['cpus']:.0f} CPUs lost it "
                         f"{e['gaps_per_ms']:.2f} times a ms for more than "
                         f"{e['min_gap_us']:g} µs, {e['away_percent']:.1f} % of the time "
                         f"(median gap {e['gap_p50_us']:.1f} µs, p99 {e['gap_p99_us']:.1f} µs); "
                         f"a task whose worker's CPU is away waits, whatever the pool")
        elif e["workload"] == "post_allocs":
            lines.append(f"- post_allocs: a {e['callable_bytes']}-byte callable costs "
                         f"{e['allocs_per_task']:.4f} allocations per post() in steady state "
                         f"({e['ns_per_task']:.0f} ns/task)")
    return lines


def fork_join_table(rows):
    lines = [
        "| workload | impl | median ns/task | min – max | ms/run | stack KiB | allocs/task "
        "| crew/impl |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for e in rows:
        impl = f"**{e['impl']}**" if e["impl"] == "crew" else e["impl"]
        workload = f"{e['workload']}({e['size']})"
        if "stack_kib" in e:
            stack = f"{e['stack_kib']:,.0f}"
        else:
            stack = e.get("stack_failure", "—")
        if "ns_per_task" not in e:
            lines.append(f"| {workload} | {impl} | {e.get('failure', 'failed')} in "
                         f"{e.get('failed_rounds', e['rounds'])} of {e['rounds']} rounds | — | — "
                         f"| {stack} | — | — |")
            continue
        cell = fmt_ns(e["ns_per_task"])
        if e.get("failed_rounds"):
            cell += f" ({e['failure']} in {e['failed_rounds']} of {e['rounds']} rounds)"
        allocs = f"{e['allocs_per_task']:.2f}" + note_mark(e.get("alloc_note"))
        lines.append(f"| {workload} | {impl} | {cell} | {fmt_ns(e['ns_per_task_min'])} – "
                     f"{fmt_ns(e['ns_per_task_max'])} | {e['ms_per_run']:,.1f} | {stack} | "
                     f"{allocs} | {fmt_ratio(e)} |")
    return lines


def fmt_us(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def fmt_count(x):
    """A rate such as context switches per second; — when the run did not
    count it (JSON from before the field)."""
    return "—" if x is None else f"{x:,.0f}"


def latency_table(rows):
    lines = [
        "| rate (tasks/s) | impl | achieved | p50 µs | p99 µs | p99.9 µs | sched p50 µs "
        "| sched p99 µs | sched p99.9 µs | crew/impl sched p99 | switches/s: voluntary "
        "| involuntary |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for e in rows:
        impl = f"**{e['impl']}**" if e["impl"] == "crew" else e["impl"]
        rate = f"{e['rate']:,.0f}" + (" (crew's max)" if e.get("max_rate_found") else "")
        ratio = e.get("crew_sched_p99_ratio_median")
        lines.append(f"| {rate} | {impl} | {e['achieved_rate']:,.0f} | {fmt_us(e['p50_us'])} | "
                     f"{fmt_us(e['p99_us'])} | {fmt_us(e['p999_us'])} | "
                     f"{fmt_us(e['sched_p50_us'])} | {fmt_us(e['sched_p99_us'])} | "
                     f"{fmt_us(e['sched_p999_us'])} | {'—' if ratio is None else f'{ratio:.2f}'} | "
                     f"{fmt_count(e.get('voluntary_switches_per_s'))} | "
                     f"{fmt_count(e.get('involuntary_switches_per_s'))} |")
    return lines


def latency_target_lines(rows):
    """crew's sched p99 against oneTBB's at each rate (≤ 1), and the quiet-machine goal."""
    by_key = {(e["impl"], e["rate"]): e for e in rows}
    lines = []
    for (impl, rate), e in sorted(by_key.items(), key=lambda kv: kv[0][1]):
        if impl != "tbb_enqueue" or ("crew", rate) not in by_key:
            continue
        ratio = e.get("crew_sched_p99_ratio_median")
        if ratio is None:
            continue
        verdict = "met" if ratio <= 1.0 else "missed"
        lines.append(f"- latency at {rate:,.0f} tasks/s: crew sched p99 / tbb_enqueue sched p99 "
                     f"median {ratio:.2f} (target ≤ 1, {verdict}); per round: "
                     + ", ".join(f"{r:.2f}" for r in e["crew_sched_p99_ratios"]))
    crew = by_key.get(("crew", 100_000))
    if crew is not None:
        met = crew["sched_p99_us"] < 20 and crew["sched_p999_us"] < 100
        lines.append(f"- latency at 100,000 tasks/s: crew sched p99 {crew['sched_p99_us']:.1f} µs, "
                     f"p99.9 {crew['sched_p999_us']:.1f} µs (goal < 20 and < 100 µs on a quiet "
                     f"machine, {'met' if met else 'missed'})")
    return lines


def markdown_body(entries, json_path):
    rows, fork_join, skips, extras = split(entries)
    latency = latency_rows(entries)
    tasks = rows[0]["tasks"] if rows else DEFAULT_TASKS
    any_rows = rows or fork_join or latency
    rounds = any_rows[0]["rounds"] if any_rows else DEFAULT_ROUNDS
    fj_sizes = {e["workload"]: e["size"] for e in fork_join}
    latency_seconds = latency[0]["seconds"] if latency else None
    run_date = datetime.date.fromtimestamp(os.path.getmtime(json_path)).isoformat()
    out = [
        f"Produced by {command_for(tasks, rounds, fj_sizes, latency_seconds)} on {run_date}; "
        f"machine: {machine()}. {tasks:,} tasks per run, {rounds} interleaved rounds, 2 worker "
        "threads per pool; each figure is the median over rounds. Every `crew` row is a pool "
        "with default `PoolOptions` (a bounded queue) but for 2 workers; `crew_unbounded` is "
        "the same with `queue_capacity = crew::kUnbounded`. Past 65,536 tasks on a shard, an "
        "unbounded queue holds the rest in its spill queue (see "
        "`PoolOptions::queue_capacity`), so with one fast producer most of crew_unbounded's "
        "tasks go through the spill, not the ring.",
        "",
    ]
    if rows:
        out += throughput_table(rows)
        out += [
            "",
            "crew/impl is the median over rounds of crew's time divided by the other pool's "
            "time in the same round: below 1 means crew is faster.",
            "",
            "Workloads: " + "; ".join(f"`{w}`: {WORKLOAD_NOTES[w]}" for w in WORKLOADS
                                      if w in WORKLOAD_NOTES) + ".",
            "",
            "![median ns/task per workload](PLOT_DIR/results.png)",
        ]
    if fork_join:
        out += [
            "",
            "### Fork-join",
            "",
            "One task per call of the recursion, no sequential cutoff; `crew`: a `crew::Group` "
            "per node (submit the children, `wait()`), `crew_task`: `Pool::submit` per child, "
            "then `get()`, `tbb_task_group`: a `tbb::task_group` per node inside a "
            "`tbb::task_arena` of 2 slots (one TBB worker plus the calling thread). ns/task is "
            "wall time x 2 threads / tasks; ms/run the wall time of one run. Each result is "
            "checked. crew's runs are made in a child process, so a crash is reported in its "
            "row; stack KiB is the deepest stack a thread reached in one extra run.",
            "",
        ]
        out += fork_join_table(fork_join)
        out += ["", "Workloads: " + "; ".join(f"`{w}`: {FORK_JOIN_NOTES[w]}"
                                              for w in FORK_JOIN) + ".",
                "", "![median ns/task, fork-join](PLOT_DIR/forkjoin.png)"]
    if latency:
        out += [
            "",
            "### Latency under a steady arrival rate",
            "",
            f"One producer posts at intended times for {latency_seconds:g} s per run at each "
            "target rate; the task records its start time and adds to an atomic. p50 / p99 / "
            "p99.9 are taken from the intended send time (a producer that falls behind is "
            "charged: coordinated omission), sched p50 / p99 / p99.9 from the `post()` call "
            "(the pool's share). crew/impl is the median of the per-round ratios of sched p99. "
            "The switches are the whole process's per second of the run (getrusage): a "
            "voluntary one is a thread that blocked (a worker going to sleep, so a wake-up "
            "follows), an involuntary one a thread preempted or yielding its CPU. "
            "polling_thread is not a pool but the machine's floor: one thread that polls a "
            "single-producer ring and never sleeps (bench/impl_polling_thread.cpp).",
            "",
        ]
        out += latency_table(latency)
        out += ["", "![latency percentiles per rate](PLOT_DIR/latency.png)"]
    targets = target_lines(rows + fork_join) + latency_target_lines(latency)
    if targets:
        out += ["", "Targets (ratios of the two series in the same round):", ""] + targets
    if any(e.get("executing_threads", 2) == 3 for e in rows):
        out += ["", "tbb_task_group runs 2 workers plus the producer on the flat workloads, "
                    "which executes tasks inside `task_group::wait()` (TBB's best case)."]
    for e in rows + fork_join:
        note_mark(e.get("alloc_note"))
    out += [f"\n{m} {n}." for n, m in NOTE_MARKS.items()]
    if skips:
        out += ["", "Skipped:", ""] + skip_lines(skips)
    extra = extras_lines(extras)
    if extra:
        out += ["", "crew only:", ""] + extra
    return "\n".join(out) + "\n"


# The README's summary: (label, kind, workload or rate, the other impl).
SUMMARY = [
    ("short_detached: 1 producer, fire-and-forget, ns/task", "flat", "short_detached", "tbb_enqueue"),
    ("short_future: a result handle per task, ns/task", "flat", "short_future", "tbb_enqueue"),
    ("producers_4: 4 producers, ns/task", "flat", "producers_4", "tbb_enqueue"),
    ("factorial: factorial(20) per task, ns/task", "flat", "factorial", "tbb_enqueue"),
    ("fib: a `crew::Group` per call, ns/task", "fj", "fib", "tbb_task_group"),
    ("skynet: a `crew::Group` per node, ns/task", "fj", "skynet", "tbb_task_group"),
    ("nqueens: a `crew::Group` per placement, ns/task", "fj", "nqueens", "tbb_task_group"),
    ("task start at 100,000 tasks/s: sched p99, µs", "latency", 100_000, "tbb_enqueue"),
    ("task start at 500,000 tasks/s: sched p99, µs", "latency", 500_000, "tbb_enqueue"),
    ("task start at 1,000,000 tasks/s: sched p99, µs", "latency", 1_000_000, "tbb_enqueue"),
]


def summary_body(entries, json_path):
    """The README's block: one row per SUMMARY entry found in the results."""
    rows, fork_join, _, _ = split(entries)
    latency = latency_rows(entries)
    flat = {(e["workload"], e["impl"]): e for e in rows}
    fj = {(e["workload"], e["impl"]): e for e in fork_join}
    lat = {(e["rate"], e["impl"]): e for e in latency}
    out = ["| figure | crew | oneTBB | crew / oneTBB |", "|---|--:|--:|--:|"]
    for label, kind, key, other in SUMMARY:
        if kind == "latency":
            a, b = lat.get((key, "crew")), lat.get((key, other))
            if a is None or b is None:
                continue
            ratio = b.get("crew_sched_p99_ratio_median")
            cells = (fmt_us(a["sched_p99_us"]), fmt_us(b["sched_p99_us"]))
        else:
            table = flat if kind == "flat" else fj
            a, b = table.get((key, "crew")), table.get((key, other))
            if a is None or b is None or "ns_per_task" not in a or "ns_per_task" not in b:
                continue
            if kind == "fj":
                label = label.replace(key, f"{key}({a['size']})", 1)
            ratio = b.get("crew_ratio_median")
            cells = (fmt_ns(a["ns_per_task"]), fmt_ns(b["ns_per_task"]))
        r = "—" if ratio is None else f"{ratio:.2f}"
        out.append(f"| {label} | {cells[0]} | {cells[1]} ({other}) | {r} |")
    run_date = datetime.date.fromtimestamp(os.path.getmtime(json_path)).isoformat()
    any_rows = rows or fork_join or latency
    rounds = any_rows[0]["rounds"] if any_rows else DEFAULT_ROUNDS
    out += ["", f"`make bench` of {run_date} on {machine()}, 2 workers per pool, medians of "
                f"{rounds} interleaved rounds; crew / oneTBB is the median of the per-round "
                "ratios (below 1: crew is faster)."]
    return "\n".join(out) + "\n"


def write_results_md(body):
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    text = ("# crew benchmark results\n\n"
            "<!-- Generated by bench/report.py; do not edit. -->\n\n"
            + body.replace("PLOT_DIR/", ""))
    (OUT_DIR / "results.md").write_text(text, encoding="utf-8")


COLORS = {"crew": "#d95f02", "crew_unbounded": "#fdae6b", "crew_task": "#e6550d",
          "tbb_enqueue": "#7570b3", "tbb_task_group": "#a6a1d9", "tbb_parallel_for": "#5a4fcf",
          "asio": "#1b9e77", "thread_pool_deb": "#808080",
          "polling_thread": "#000000"}


def gnuplot_script(rows, data_file, png, title, producer_note):
    impls = [i for i in IMPLS if any(e["impl"] == i for e in rows)]
    n = len(impls)
    values = [e["ns_per_task"] for e in rows]
    # Bars start at the bottom of the axis: a power of 10 below the fastest.
    lo = 10 ** math.floor(math.log10(max(min(values), 1e-3) * 0.8))
    hi = max(values) * 2.5
    plots = []
    for col, impl in enumerate(impls, start=2):
        source = f"'{data_file}'" if col == 2 else "''"
        xtic = ":xtic(1)" if col == 2 else ""
        label = (f"{impl} (2 workers + producer)" if impl == "tbb_task_group" and producer_note
                 else impl)
        plots.append(f"{source} using {col}{xtic} title '{label}' "
                     f"lc rgb '{COLORS.get(impl, '#333333')}'")
    # Value labels centred on each bar of a cluster (n bars plus a gap of 1).
    for col in range(2, n + 2):
        offset = (col - 2 - (n - 1) / 2) / (n + 1)
        plots.append(f"'' using ($0+{offset:.4f}):{col}:(sprintf('%.0f', ${col})) "
                     "with labels offset 0,0.6 font ',8' notitle")
    return "\n".join([
        "set terminal pngcairo size 1200,640 font 'Sans,11' noenhanced",
        f"set output '{png}'",
        f"set title '{title}'",
        "set style data histograms",
        "set style histogram clustered gap 1",
        "set style fill solid 0.9 border rgb '#404040'",
        "set boxwidth 0.95",
        "set logscale y",
        f"set yrange [{lo:g}:{hi:g}]",
        "set ylabel 'median ns per task (log scale, lower is better)'",
        "set grid ytics mytics",
        "set key outside right top",
        "set datafile missing '?'",
        "set xtics nomirror",
        "plot " + ", \\\n  ".join(plots),
        "",
    ]), impls


def have_gnuplot(png):
    if shutil.which("gnuplot") is None:
        print(f"report.py: gnuplot not found; skipping {png}", file=sys.stderr)
        return False
    return True


def write_bar_plot(rows, png, title, label, producer_note):
    """Clustered bars of ns_per_task, one cluster per workload (rows with figures only)."""
    rows = [e for e in rows if "ns_per_task" in e]
    if not rows or not have_gnuplot(png):
        return
    by_key = {(e["workload"], e["impl"]): e["ns_per_task"] for e in rows}
    names = {e["workload"]: label(e) for e in rows}
    workloads = [w for w in WORKLOADS if w in names]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "results.dat"
        script, impls = gnuplot_script(rows, data, OUT_DIR / png, title, producer_note)
        lines = ["# workload " + " ".join(impls)]
        for w in workloads:
            values = [by_key.get((w, i)) for i in impls]
            lines.append(names[w] + " " +
                         " ".join("?" if v is None else f"{v:.3f}" for v in values))
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


def write_latency_plot(rows):
    """Three panels (p50, p99, p99.9) of µs per target rate, one colour per impl: solid from
    the intended time, dashed from the post() call."""
    png = "latency.png"
    if not rows or not have_gnuplot(png):
        return
    impls = [i for i in IMPLS if any(e["impl"] == i for e in rows)]
    rates = sorted({e["rate"] for e in rows})
    by_key = {(e["impl"], e["rate"]): e for e in rows}
    values = [e[k] for e in rows for k in ("p50_us", "p99_us", "p999_us", "sched_p50_us",
                                           "sched_p99_us", "sched_p999_us")]
    lo = 10 ** math.floor(math.log10(max(min(values), 1e-2)))
    hi = 10 ** math.ceil(math.log10(max(values) * 1.5))
    with tempfile.TemporaryDirectory() as tmp:
        cmds = [
            "set terminal pngcairo size 1500,560 font 'Sans,11' noenhanced",
            f"set output '{OUT_DIR / png}'",
            "set multiplot layout 1,3 title 'crew_bench latency: one producer at a target "
            "rate, 2 workers per pool, polling_thread 1 (solid: from intended time, dashed: from post())'",
            "set logscale xy",
            f"set yrange [{lo:g}:{hi:g}]",
            f"set xrange [{rates[0] * 0.7:g}:{rates[-1] * 1.4:g}]",
            "set xtics (" + ", ".join(f"'{r / 1000:,.0f}k' {r:g}" for r in rates) + ")",
            "set xlabel 'target tasks/s'",
            "set grid xtics ytics mytics",
            "set key top left font ',9'",
        ]
        for col, (name, key) in enumerate((("p50", "p50_us"), ("p99", "p99_us"),
                                           ("p99.9", "p999_us"))):
            plots = []
            for impl in impls:
                data = Path(tmp) / f"{impl}-{key}.dat"
                data.write_text("\n".join(
                    f"{r:g} {by_key[(impl, r)][key]:.3f} {by_key[(impl, r)]['sched_' + key]:.3f}"
                    for r in rates if (impl, r) in by_key) + "\n", encoding="utf-8")
                color = COLORS.get(impl, "#333333")
                plots.append(f"'{data}' using 1:2 with linespoints lw 2 pt 7 lc rgb '{color}' "
                             f"title '{impl}'")
                plots.append(f"'{data}' using 1:3 with linespoints lw 2 dt 2 pt 6 "
                             f"lc rgb '{color}' notitle")
            cmds += [f"set title '{name}'",
                     "set ylabel 'µs (log scale)'" if col == 0 else "unset ylabel",
                     "plot " + ", ".join(plots)]
        cmds += ["unset multiplot", ""]
        subprocess.run(["gnuplot"], input="\n".join(cmds), text=True, check=True)


def update_readme(body):
    """Writes `body` (the summary) between the README's markers."""
    if not README.exists():
        print(f"report.py: {README} not found; not updated", file=sys.stderr)
        return
    text = README.read_text(encoding="utf-8")
    start = text.find(OPEN_MARK)
    if start < 0:
        print(f"report.py: no {OPEN_MARK} in README.md; not updated", file=sys.stderr)
        return
    block = (OPEN_MARK + "\n" + body +
             "\nAll tables, plots and targets: [docs/bench/results.md](docs/bench/results.md).\n"
             + CLOSE_MARK)
    end = text.find(CLOSE_MARK, start)
    tail = text[end + len(CLOSE_MARK):] if end >= 0 else text[start + len(OPEN_MARK):]
    README.write_text(text[:start] + block + tail, encoding="utf-8")


def main():
    json_path = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build" / "bench-results.json")
    entries = load(json_path)
    rows, fork_join, _, _ = split(entries)
    latency = latency_rows(entries)
    if not rows and not fork_join and not latency:
        sys.exit(f"report.py: {json_path}: no results")
    body = markdown_body(entries, json_path)
    write_results_md(body)
    update_readme(summary_body(entries, json_path))
    if rows:
        write_bar_plot(rows, "results.png",
                       f"crew_bench: median ns/task, 2 workers, {rows[0]['tasks']:,} tasks, "
                       f"{rows[0]['rounds']} rounds", lambda e: e["workload"], True)
    if fork_join:
        write_bar_plot(fork_join, "forkjoin.png",
                       "crew_bench fork-join: median ns/task (wall x 2 threads / tasks), "
                       f"{fork_join[0]['rounds']} rounds",
                       lambda e: f"{e['workload']}({e['size']})", False)
    write_latency_plot(latency)
    print(f"report.py: wrote {OUT_DIR / 'results.md'} and its plots")


if __name__ == "__main__":
    main()

"""The Markdown of report.py: the tables, targets and notes of
docs/bench/results.md (markdown_body) and README.md's summary (summary_body).
"""

import datetime
import os
import statistics

from report_results import (DEFAULT_FJ_SIZES, DEFAULT_LATENCY_SECONDS, DEFAULT_ROUNDS,
                            DEFAULT_TASKS, FORK_JOIN, FORK_JOIN_NOTES, LATENCY_ONLY, TARGETS,
                            WORKLOAD_NOTES, WORKLOADS, latency_rows, split)

# Footnote marks of the allocation notes, in the order the tables meet them.
NOTE_MARKS = {}


def note_mark(note):
    """The superscript that marks `note` ("" for none)."""
    if not note:
        return ""
    if note not in NOTE_MARKS:
        NOTE_MARKS[note] = "¹²³⁴⁵⁶⁷⁸⁹"[len(NOTE_MARKS)]
    return NOTE_MARKS[note]


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

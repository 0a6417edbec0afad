#!/usr/bin/env python3
"""Turns crew_bench's JSON into docs/bench/results.md, docs/bench/results.png
and the benchmark block of README.md.

    python3 bench/report.py [build/bench-results.json]

README.md gets the table between `<!-- bench-table -->` and
`<!-- /bench-table -->` (a lone opening marker gets the table and a closing
marker after it). Python standard library only; the plot needs gnuplot.
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

IMPLS = ["crew", "crew_fifo", "crew_priority", "crew_metrics", "crew_null_observer",
         "tbb_enqueue", "tbb_task_group", "tbb_parallel_for", "asio", "thread_pool_deb"]
WORKLOADS = ["short_detached", "short_future", "producers_4", "factorial", "long_deadline",
             "group_wait", "funcpool_invoke", "parallel_for"]
EXTRAS = {"idle_cpu", "queued_memory", "post_allocs", "shutdown_hard", "shutdown_soft",
          "metrics_scrape"}
DEFAULT_TASKS, DEFAULT_ROUNDS = 1_000_000, 9

WORKLOAD_NOTES = {
    "short_detached": "1 producer, fire-and-forget, task = one atomic add",
    "short_future": "as short_detached with a result handle per task, then get() on all",
    "producers_4": "4 producer threads, fire-and-forget",
    "factorial": "task = factorial(20) in uint64_t added to an atomic",
    "long_deadline": "crew long tasks (std::stop_token) with a 1 s deadline, none expiring",
    "group_wait": "short tasks submitted into a crew::Group, then one wait()",
    "funcpool_invoke": "crew::FuncPool<uint64_t>::invoke, handler = short_detached's task body",
    "parallel_for": "10 x tasks indices (10,000,000 by default), body p[i] = i on a uint32 "
                    "array; figures are per index",
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
]


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
    """(throughput rows, skipped rows, crew-only extras), each in table order."""
    rows = [e for e in entries if e["workload"] not in EXTRAS and "ns_per_task" in e]
    skips = [e for e in entries if "skipped" in e]
    extras = [e for e in entries if e["workload"] in EXTRAS]
    return sorted(rows, key=order_key), sorted(skips, key=order_key), extras


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


def command_for(tasks, rounds):
    if tasks == DEFAULT_TASKS and rounds == DEFAULT_ROUNDS:
        return "`make bench`"
    return (f"`./build/bench/crew_bench --tasks {tasks} --rounds {rounds} "
            "--json build/bench-results.json && python3 bench/report.py build/bench-results.json`")


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
        allocs = f"{e['allocs_per_task']:.2f}"
        if e.get("alloc_note"):
            allocs += "¹"
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
        ratios = [x / y for x, y in zip(a["ns_per_task_rounds"], b["ns_per_task_rounds"])]
        median = statistics.median(ratios)
        verdict = "met" if median <= bound else "missed"
        lines.append(f"- {label}: median {median:.2f} (target ≤ {bound:g}, {verdict}); "
                     "per round: " + ", ".join(f"{r:.2f}" for r in ratios))
    return lines


def skip_lines(skips):
    """One bullet per (workload, reason), listing the implementations it skips."""
    grouped = {}
    for e in skips:
        grouped.setdefault((e["workload"], e["skipped"]), []).append(e["impl"])
    return [f"- {workload} for {', '.join(impls)}: {reason}"
            for (workload, reason), impls in grouped.items()]


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
        elif e["workload"] == "post_allocs":
            lines.append(f"- post_allocs: a {e['callable_bytes']}-byte callable costs "
                         f"{e['allocs_per_task']:.4f} allocations per post() in steady state "
                         f"({e['ns_per_task']:.0f} ns/task)")
    return lines


def markdown_body(entries, json_path):
    rows, skips, extras = split(entries)
    tasks = rows[0]["tasks"] if rows else DEFAULT_TASKS
    rounds = rows[0]["rounds"] if rows else DEFAULT_ROUNDS
    run_date = datetime.date.fromtimestamp(os.path.getmtime(json_path)).isoformat()
    out = [
        f"Produced by {command_for(tasks, rounds)} on {run_date}; machine: {machine()}. "
        f"{tasks:,} tasks per run, {rounds} interleaved rounds, 2 worker threads per pool; "
        "each figure is the median over rounds.",
        "",
    ]
    out += throughput_table(rows)
    out += [
        "",
        "crew/impl is the median over rounds of crew's time divided by the other pool's time "
        "in the same round: below 1 means crew is faster.",
        "",
        "Workloads: " + "; ".join(f"`{w}`: {WORKLOAD_NOTES[w]}" for w in WORKLOADS) + ".",
    ]
    targets = target_lines(rows)
    if targets:
        out += ["", "Targets (ratios of the two series in the same round):", ""] + targets
    if any(e.get("executing_threads", 2) == 3 for e in rows):
        out += ["", "tbb_task_group runs 2 workers plus the producer, which executes tasks "
                    "inside `task_group::wait()` (TBB's best case)."]
    notes = sorted({e["alloc_note"] for e in rows if e.get("alloc_note")})
    out += [f"\n¹ {n}." for n in notes]
    if skips:
        out += ["", "Skipped:", ""] + skip_lines(skips)
    extra = extras_lines(extras)
    if extra:
        out += ["", "crew only:", ""] + extra
    return "\n".join(out) + "\n"


def write_results_md(body):
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    text = ("# crew benchmark results\n\n"
            "<!-- Generated by bench/report.py; do not edit. -->\n\n"
            + body + "\n![median ns/task per workload](results.png)\n")
    (OUT_DIR / "results.md").write_text(text, encoding="utf-8")


def gnuplot_script(rows, data_file, png, title):
    impls = [i for i in IMPLS if any(e["impl"] == i for e in rows)]
    colors = {"crew": "#d95f02", "tbb_enqueue": "#7570b3", "tbb_task_group": "#a6a1d9",
              "tbb_parallel_for": "#5a4fcf", "asio": "#1b9e77", "thread_pool_deb": "#808080"}
    n = len(impls)
    values = [e["ns_per_task"] for e in rows]
    # Bars start at the bottom of the axis: a power of 10 below the fastest.
    lo = 10 ** math.floor(math.log10(max(min(values), 1e-3) * 0.8))
    hi = max(values) * 2.5
    plots = []
    for col, impl in enumerate(impls, start=2):
        source = f"'{data_file}'" if col == 2 else "''"
        xtic = ":xtic(1)" if col == 2 else ""
        label = f"{impl} (2 workers + producer)" if impl == "tbb_task_group" else impl
        plots.append(f"{source} using {col}{xtic} title '{label}' "
                     f"lc rgb '{colors.get(impl, '#333333')}'")
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


def write_plot(rows, tasks, rounds):
    if shutil.which("gnuplot") is None:
        print("report.py: gnuplot not found; skipping results.png", file=sys.stderr)
        return
    by_key = {(e["workload"], e["impl"]): e["ns_per_task"] for e in rows}
    workloads = [w for w in WORKLOADS if any(e["workload"] == w for e in rows)]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "results.dat"
        script, impls = gnuplot_script(
            rows, data, OUT_DIR / "results.png",
            f"crew_bench: median ns/task, 2 workers, {tasks:,} tasks, {rounds} rounds")
        lines = ["# workload " + " ".join(impls)]
        for w in workloads:
            values = [by_key.get((w, i)) for i in impls]
            lines.append(w + " " + " ".join("?" if v is None else f"{v:.3f}" for v in values))
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


def update_readme(body):
    if not README.exists():
        print(f"report.py: {README} not found; not updated", file=sys.stderr)
        return
    text = README.read_text(encoding="utf-8")
    start = text.find(OPEN_MARK)
    if start < 0:
        print(f"report.py: no {OPEN_MARK} in README.md; not updated", file=sys.stderr)
        return
    block = (OPEN_MARK + "\n" + body +
             "\n![median ns/task per workload](docs/bench/results.png)\n\n"
             "Details: [docs/bench/results.md](docs/bench/results.md).\n" + CLOSE_MARK)
    end = text.find(CLOSE_MARK, start)
    tail = text[end + len(CLOSE_MARK):] if end >= 0 else text[start + len(OPEN_MARK):]
    README.write_text(text[:start] + block + tail, encoding="utf-8")


def main():
    json_path = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build" / "bench-results.json")
    entries = load(json_path)
    rows, _, _ = split(entries)
    if not rows:
        sys.exit(f"report.py: {json_path}: no throughput results")
    body = markdown_body(entries, json_path)
    write_results_md(body)
    write_plot(rows, rows[0]["tasks"], rows[0]["rounds"])
    update_readme(body)
    print(f"report.py: wrote {OUT_DIR / 'results.md'} and {OUT_DIR / 'results.png'}")


if __name__ == "__main__":
    main()

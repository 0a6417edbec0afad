"""The plots of report.py, drawn by gnuplot: clustered bars of ns/task
(docs/bench/results.png, docs/bench/forkjoin.png) and the latency
percentiles per rate (docs/bench/latency.png).
"""

import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from report_results import IMPLS, OUT_DIR, WORKLOADS

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

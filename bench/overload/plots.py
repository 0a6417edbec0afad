"""The plots of run.py (matplotlib): goodput and p99 against the offered
load (PLOT), per second of the step, spike and drop runs (PLOT-series.png),
and the admission limit over time (PLOT-limit.png). slo_ms is each
workload's latency objective by name (run.py's SLO_MS).
"""
import sys

from digest import median


def plot(path, results, mus, workloads, variants, loads, slo_ms):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no matplotlib in {sys.executable}: no plot (Debian's python3-matplotlib "
              "is for /usr/bin/python3)", file=sys.stderr)
        return False
    fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 7), squeeze=False)
    for col, w in enumerate(workloads):
        for v in variants:
            xs, good, p99 = [], [], []
            for load in loads:
                runs = [r for r in results.get((w, f"steady {load:g}x", v), []) if "error" not in r]
                if not runs:
                    continue
                xs.append(load)
                good.append(median([r["goodput_per_s"] for r in runs]) / mus[w])
                p99.append(median([r["p99_ms"] for r in runs]))
            if xs:
                axes[0][col].plot(xs, good, marker="o", label=v)
                axes[1][col].plot(xs, p99, marker="o", label=v)
        slo = slo_ms[w]
        axes[0][col].axhline(0.9, color="grey", linestyle=":", label="0.9 mu (target)")
        axes[0][col].set_title(f"{w}: goodput (2xx within {slo:g} ms) / mu, mu = {mus[w]:.0f}/s")
        axes[0][col].set_xlabel("offered load / mu")
        axes[0][col].set_ylim(bottom=0)
        axes[1][col].axhline(slo, color="grey", linestyle=":", label=f"SLO {slo:g} ms")
        axes[1][col].set_yscale("log")
        axes[1][col].set_title(f"{w}: p99 latency of answered requests (ms)")
        axes[1][col].set_xlabel("offered load / mu")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(loads, [f"{x:g}" for x in loads])
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")
    return True


def plot_series(path, raw, workloads, variants, scenarios, slo_ms):
    """Per second of the step and spike runs and W4's drop (median over
    the rounds): goodput and p99 of each (workload, scenario)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = [(w, sc) for w in workloads for sc in scenarios if sc in ("step", "spike")
            and w != "W4"]
    cols += [(w, "drop 0.8x") for w in workloads if w == "W4"]
    if not cols:
        return
    # One row per (workload, scenario): goodput, then p99.
    fig, rows = plt.subplots(len(cols), 2, figsize=(11, 2.6 * len(cols)), squeeze=False)
    axes = rows.T
    for col, (w, sc) in enumerate(cols):
        for v in variants:
            runs = [r for r in raw if r["workload"] == w and r["scenario"] == sc
                    and r["variant"] == v and r["per_second"]]
            if not runs:
                continue
            n = min(len(r["per_second"]) for r in runs)
            good = [median([r["per_second"][i]["goodput"] for r in runs]) for i in range(n)]
            p99 = [median([r["per_second"][i]["p99_ms"] or None for r in runs])
                   for i in range(n)]
            axes[0][col].plot(range(n), good, label=v)
            axes[1][col].plot(range(n), [x if x else float("nan") for x in p99], label=v)
            sched = [median([r["per_second"][i]["scheduled"] for r in runs]) for i in range(n)]
        if runs:
            axes[0][col].plot(range(n), sched, color="grey", linestyle=":", label="offered")
        axes[0][col].set_title(f"{w} {sc}: goodput per second")
        axes[1][col].axhline(slo_ms[w], color="grey", linestyle=":", label="SLO")
        axes[1][col].set_yscale("log")
        axes[1][col].set_title(f"{w} {sc}: p99 per second (ms)")
        for ax in axes[:, col]:
            per_second_axis(ax)
    save_figure(fig, path)


def per_second_axis(ax):
    ax.set_xlabel("s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def save_figure(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


def plot_limit(path, raw, workloads, variant="controller"):
    """The admission limit over time (the once-a-second /metrics samples,
    median over the rounds) of `variant`'s runs: one panel per workload,
    a line per scenario."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.6),
                             squeeze=False)
    for col, w in enumerate(workloads):
        ax = axes[0][col]
        labels = sorted({r["scenario"] for r in raw if r["workload"] == w})
        for label in labels:
            series = [[m["limit"] for m in (r.get("metrics") or []) if m["limit"] is not None]
                      for r in raw if r["workload"] == w and r["scenario"] == label
                      and r["variant"] == variant]
            series = [x for x in series if x]
            if not series:
                continue
            n = min(len(x) for x in series)
            ax.plot(range(1, n + 1), [median([x[i] for x in series]) for i in range(n)],
                    marker=".", label=label)
        ax.set_yscale("log")
        ax.set_title(f"{w}: admission limit of pool jobs ({variant})")
        per_second_axis(ax)
    save_figure(fig, path)


def plots(path, results, raw, mus, workloads, variants, loads, scenarios, slo_ms):
    if plot(path, results, mus, [w for w in workloads if w != "W4"], variants, loads,
            slo_ms):
        plot_series(path.replace(".png", "-series.png"), raw, workloads, variants, scenarios,
                    slo_ms)
        if "controller" in variants:
            plot_limit(path.replace(".png", "-limit.png"), raw, workloads)

#!/usr/bin/env python3
"""crewd under overload: goodput, tail latency and rejections of POST
/api/v1/jobs when more work arrives than it can do (docs/bench/overload.md).

crewd runs on one CPU and the open-loop generator (build/bench/loadgen/
loadgen) on another, so neither takes the other's CPU. For each workload the
harness first measures crewd's capacity mu with an open-loop ramp, then
sends Poisson arrivals at multiples of mu (and the step and spike scenarios),
for every variant of crewd's settings, interleaved round by round: one
round runs every (workload, scenario, variant) once, in that order, so the
machine's drift spreads over all of them. Each run starts a fresh crewd.
/metrics is scraped once a second for the jobs queue length and for the
admission limit gauge (--limit-metric), when crewd exports one.

  python3 bench/overload/run.py [--workloads W1,W2] [--variants defaults,fixed]
      [--loads 0.5,1,2,4] [--scenarios steady,step,spike] [--rounds 5]
      [--duration 20] [--out build/bench-overload] [--plot docs/bench/overload.png]

Prints each run, then the medians over the rounds as a Markdown table
(also written to OUT/table.md), and writes every run's numbers and
per-second series to OUT/runs.json. Needs crewd and loadgen built
(`make bench-overload` builds both), python3-matplotlib for the plot.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass

# crewd's stop (SIGTERM, then SIGKILL after 30 s), shared with the
# throughput figures' script.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "service", "bench"))
from wrk import stop  # noqa: E402

# A workload: the job every request asks for, crewd's settings that make
# it that workload, and the latency objective goodput is counted against.
# job_after_drop is the job from half-way on (W4).
@dataclass
class Workload:
    name: str
    what: str
    job: dict
    crewd: list
    slo_ms: float
    job_after_drop: dict = None


JOB_TIMEOUT_MS = 1000
# W2 and W4's bound on concurrency. Their sleep jobs are coroutine tasks that
# hold no worker while they sleep, so jobs.workers no longer bounds them;
# jobs.max_in_flight does (16 / 20 ms = 800/s), refusing the 17th from the
# request's head (503, reason max_in_flight). The pool's overload controller
# sees a sleep job only until its first suspension (its ticket goes back when
# the first step ends), so with these jobs it is this cap that limits.
WAITING = ["--jobs-workers", "16", "--jobs-max-in-flight", "16"]
WORKLOADS = {
    w.name: w for w in [
        Workload("W1", "CPU-bound: spin 2 ms, jobs.workers = 1",
                 {"kind": "spin", "ms": 2}, ["--jobs-workers", "1"], 50),
        Workload("W2", "waiting: sleep 20 ms, at most 16 in flight (jobs.max_in_flight)",
                 {"kind": "sleep", "ms": 20}, WAITING, 200),
        Workload("W3", "hidden queue: spin 2 ms, jobs.workers = 64 on one CPU",
                 {"kind": "spin", "ms": 2},
                 ["--jobs-workers", "64", "--jobs-overload-run-time-signal", "true"], 50),
        Workload("W4", "capacity drops 4x mid-run: sleep 20 ms, then 80 ms, 16 in flight",
                 {"kind": "sleep", "ms": 20}, WAITING, 200,
                 job_after_drop={"kind": "sleep", "ms": 80}),
    ]
}

# The variants of crewd's settings each scenario runs with: name, what it
# is, and crewd's flags (added after the workload's). flags None: not
# available yet, listed and skipped. Adding a variant is one line.
#
# "fixed" is a static limit hand-tuned for W1 (mu ~ 500/s, SLO 50 ms): a
# job queued behind k others waits ~2k ms, so at most 16 queued keeps the
# wait near 32 ms plus the run and the I/O thread's share of the CPU; a job
# not started within 45 ms is dropped (answered 503 at that deadline)
# because it would miss the SLO anyway. The same limit is used for every
# workload, which is the point: it is right for W1 only.
#
# "codel" and "controller" are crewd's overload controller (jobs.overload,
# on by default since it exists) with its default target 5 ms and interval
# 100 ms: CoDel's dequeue drop alone (no admission limit), and the whole
# controller (adaptive limit checked from the request's head, CoDel,
# deadline-aware admission). The other two turn it off.
NO_CONTROLLER = ["--jobs-overload", "false"]
VARIANTS = [
    ("defaults", "defaults before the controller (jobs.queue 1024, jobs.queue_timeout_ms 5000)",
     NO_CONTROLLER),
    ("fixed", "fixed limit for W1: jobs.queue 16, jobs.queue_timeout_ms 45",
     ["--jobs-queue", "16", "--jobs-queue-timeout-ms", "45", *NO_CONTROLLER]),
    ("codel", "CoDel dequeue drop alone (jobs.overload_adaptive_limit false)",
     ["--jobs-overload-adaptive-limit", "false"]),
    ("controller", "full controller: adaptive limit from the head, CoDel, deadline-aware "
                   "admission (crewd's defaults)", []),
]

# Reasons of a 503 decided at admission (from the request's head or at
# submission), not after the request waited in the queue.
ADMISSION_REASONS = {"limit", "deadline", "rate", "max_in_flight", "full", "closed", "too_many_blocked"}

# Scenarios: phases as (multiple of mu, seconds, job index: 0 the
# workload's job, 1 its job after the drop), and the overload window
# (start, end) that recovery is measured from. steady runs --duration at
# each of --loads; step and spike have fixed lengths.
def scenario_phases(name, load, duration):
    if name == "steady":
        return [(load, duration, 0)], None
    if name == "step":  # 0.5x, 4x, 0.5x: 10 s each
        return [(0.5, 10, 0), (4.0, 10, 0), (0.5, 10, 0)], (10, 20)
    if name == "spike":  # 0.7x with a 10 s spike to 1.4x
        return [(0.7, 10, 0), (1.4, 10, 0), (0.7, 10, 0)], (10, 20)
    if name == "drop":  # W4: the same arrivals, each job 4x longer from half-way on
        half = duration / 2
        return [(load, half, 0), (load, half, 1)], None
    raise ValueError(name)


def drop_of(label, phases, mu):
    """W4's drop: (its second, the capacity after it: a quarter of mu), or None."""
    if not label.startswith("drop"):
        return None
    return phases[0][1], mu / 4


def label_phases(label, duration):
    """The phases and overload window of a scenario label of the plan
    ("steady 2x", "step", "spike", "drop 0.8x")."""
    name, _, load = label.partition(" ")
    return scenario_phases(name, float(load.rstrip("x")) if load else 0, duration)


def crewd_port(cmd, nice):
    # A session of its own is a scheduler autogroup of its own (Linux
    # CONFIG_SCHED_AUTOGROUP): the machine's other sessions share the CPU
    # with it by the group's nice, which a process's own nice does not move.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        with open(f"/proc/{proc.pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass  # no autogroups: the process's nice is what counts
    deadline = time.monotonic() + 10
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:([0-9]+)", line)
        if m:
            # Keep reading its output so that it never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    proc.wait()
    return None, "".join(lines[-5:])


def metric_value(text, name):
    """The value of the sample `name` (with its labels, as exported) in a
    Prometheus text page, or None."""
    for line in text.splitlines():
        if line.startswith(name + " ") or (("{" in name) and line.startswith(name)):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


class Scraper(threading.Thread):
    """GET /metrics once a second; keeps (t, queue length, limit) samples."""

    def __init__(self, port, limit_metric):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.limit_metric = limit_metric
        self.samples = []
        self.done = threading.Event()

    def run(self):
        start = time.monotonic()
        while not self.done.wait(1.0):
            try:
                text = urllib.request.urlopen(self.url, timeout=1).read().decode()
            except OSError:
                continue
            self.samples.append({
                "t": round(time.monotonic() - start, 2),
                "queue": metric_value(text, 'crew_queue_length{pool="jobs"}'),
                "limit": metric_value(text, self.limit_metric) if self.limit_metric else None,
            })


def crewd_cmd(args, workload, flags):
    return ["nice", "-n", str(args.nice), "taskset", "-c", args.crewd_cpus, args.crewd,
            "--listen", "127.0.0.1:0", "--log-level", "info", *workload.crewd, *flags]


def loadgen(args, port, workload, phases, mu, tag):
    out = os.path.join(args.out, f"{tag}.json")
    jobs = [workload.job, workload.job_after_drop or workload.job]
    cmd = [*args.loadgen_prefix, "taskset", "-c", args.loadgen_cpus, args.loadgen,
           "--url", f"http://127.0.0.1:{port}/api/v1/jobs",
           "--header", "Content-Type: application/json",
           "--slo-ms", str(workload.slo_ms), "--timeout-ms", "15000",
           "--connections", "32", "--json", out, "--quiet", "--seed", str(args.seed)]
    for job in jobs:
        cmd += ["--body", json.dumps({**job, "timeout_ms": JOB_TIMEOUT_MS}, separators=(",", ":"))]
    for mult, seconds, job_index in phases:
        cmd += ["--phase", f"{mult * mu:.1f}:{seconds:g}:{job_index}"]
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)


def one_run(args, workload, flags, phases, mu, tag):
    proc, port = crewd_port(crewd_cmd(args, workload, flags), args.nice)
    if proc is None:
        return {"error": port.strip()}
    scraper = Scraper(port, args.limit_metric)
    scraper.start()
    try:
        summary = loadgen(args, port, workload, phases, mu, tag)
    finally:
        scraper.done.set()
        scraper.join()
        stop(proc)
    summary["metrics"] = scraper.samples
    return summary


def measure_mu(args, workload):
    """Open-loop ramp on today's defaults: 2 s phases from mu_guess/5 up by
    25 % each to 3 mu_guess; mu is the largest 2xx rate of any second."""
    rates, r = [], args.mu_guess[workload.name] / 5
    while r < 3 * args.mu_guess[workload.name]:
        rates.append(r)
        r *= 1.25
    phases = [(rate, 2, 0) for rate in rates]
    s = one_run(args, workload, NO_CONTROLLER, phases, 1.0, f"{workload.name}-ramp")
    ok = [sec["ok"] for sec in s["per_second"]]
    # The largest 2xx rate held for two seconds in a row (one burst second
    # after a stall is not capacity).
    return max(min(a, b) for a, b in zip(ok, ok[1:])), s


def recovery_s(summary, window, slo_ms):
    """Seconds from the end of the overload until three seconds in a row
    answer at least 90 % of what they schedule with p99 within the SLO."""
    if window is None:
        return None
    secs = summary["per_second"]
    end = int(window[1])
    for i in range(end, len(secs) - 2):
        if all(s["p99_ms"] <= slo_ms and s["ok"] >= 0.9 * s["scheduled"]
               for s in secs[i:i + 3]):
            return i - end
    return None  # not within the run


def drop_recovery_s(summary, drop_at, new_mu):
    """W4: seconds from the drop until two seconds in a row have goodput of
    at least 0.9 of the capacity after it (new_mu)."""
    secs = summary["per_second"]
    start = int(drop_at)
    for i in range(start, len(secs) - 1):
        if all(s["goodput"] >= 0.9 * new_mu for s in secs[i:i + 2]):
            return i - start
    return None  # not within the run


def digest(summary, seconds, window, slo_ms, drop=None):
    rej = summary["rejection_latency_ms"]
    queue = [m["queue"] for m in summary.get("metrics", []) if m["queue"] is not None]
    limit = [m["limit"] for m in summary.get("metrics", []) if m["limit"] is not None]
    # The limit's coefficient of variation once settled (after 5 s).
    settled = [m["limit"] for m in summary.get("metrics", [])
               if m["limit"] is not None and m["t"] >= 5]
    limit_cv = (statistics.pstdev(settled) / statistics.mean(settled)
                if len(settled) >= 3 and statistics.mean(settled) > 0 else None)
    by_reason = summary["rejection_latency_by_reason_ms"]
    total_rej = sum(v["count"] for v in by_reason.values())
    at_admission = sum(v["count"] for k, v in by_reason.items()
                       if k.removeprefix("503 ") in ADMISSION_REASONS)
    return {
        "offered_per_s": summary["target_rate"],
        "goodput_per_s": summary["goodput"] / seconds,
        "ok_per_s": summary["status"].get("200", 0) / seconds,
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
        "p999_ms": summary["latency_ms"]["p99.9"],
        "rejected": sum(summary["rejections"].values()),
        "rejections": {k.removeprefix("503 "): {"count": v["count"], "p99_ms": v["p99"]}
                       for k, v in summary["rejection_latency_by_reason_ms"].items()},
        "rejection_p99_ms": rej["p99"] if rej["count"] else None,
        "errors": sum(summary["errors"].values()),
        "late_sends": summary["late_sends"],
        "send_lag_p99_ms": summary["send_lag_ms"]["p99"],
        "queue_max": max(queue) if queue else None,
        "limit_last": limit[-1] if limit else None,
        "limit_min": min(limit) if limit else None,
        "limit_cv": limit_cv,
        "admission_fraction": at_admission / total_rej if total_rej else None,
        "recovery_s": recovery_s(summary, window, slo_ms),
        # W4 (drop = (second of the drop, capacity after it)).
        "drop_recovery_s": drop_recovery_s(summary, *drop) if drop else None,
    }


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(results, mus):
    head = ("| workload | scenario | variant | offered/s | goodput/s | goodput/mu | p50 ms "
            "| p99 ms | p99.9 ms | rejected | rejection p99 ms | by reason: count (p99) | queue max "
            "| limit (min) | limit CV | at admission | recovery s |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for key, runs in results.items():
        wname, scen, variant = key
        d = [r for r in runs if "error" not in r]
        if not d:
            continue
        m = {k: median([r[k] for r in d]) for k in d[0] if k != "rejections"}
        reasons = {}
        for r in d:
            for k, v in r["rejections"].items():
                reasons.setdefault(k, []).append(v)
        reason_text = "; ".join(
            f"{k}: {median([x['count'] for x in v]):.0f} "
            f"(p99 {fmt(median([x['p99_ms'] for x in v]), 2)} ms)"
            for k, v in sorted(reasons.items())) or "–"
        lines.append(
            f"| {wname} | {scen} | {variant} | {fmt(m['offered_per_s'], 0)} "
            f"| {fmt(m['goodput_per_s'], 0)} | {fmt(m['goodput_per_s'] / mus[wname], 2)} "
            f"| {fmt(m['p50_ms'])} | {fmt(m['p99_ms'])} | {fmt(m['p999_ms'])} "
            f"| {fmt(m['rejected'], 0)} | {fmt(m['rejection_p99_ms'], 2)} | {reason_text} "
            f"| {fmt(m['queue_max'], 0)} | {fmt(m['limit_last'], 0)} ({fmt(m.get('limit_min'), 0)}) "
            f"| {fmt(m.get('limit_cv'), 2)} | {fmt(m.get('admission_fraction'), 2)} "
            f"| {fmt(m['recovery_s'] if m['recovery_s'] is not None else m.get('drop_recovery_s'), 0)} |")
    return "\n".join(lines)


def plot(path, results, mus, workloads, variants, loads):
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
        slo = WORKLOADS[w].slo_ms
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


def plot_series(path, raw, workloads, variants, scenarios):
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
        axes[1][col].axhline(WORKLOADS[w].slo_ms, color="grey", linestyle=":", label="SLO")
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


def plots(path, results, raw, mus, workloads, variants, loads, scenarios):
    if plot(path, results, mus, [w for w in workloads if w != "W4"], variants, loads):
        plot_series(path.replace(".png", "-series.png"), raw, workloads, variants, scenarios)
        if "controller" in variants:
            plot_limit(path.replace(".png", "-limit.png"), raw, workloads)


def retable(args, workloads, variants, loads, scenarios):
    with open(os.path.join(args.out, "runs.json")) as f:
        data = json.load(f)
    mus, results = data["mu"], {}
    for r in data["runs"]:
        if "error" in r["digest"]:
            continue
        with open(os.path.join(args.out, r["tag"] + ".json")) as f:
            summary = json.load(f)
        summary["metrics"] = r["metrics"] or []
        phases, window = label_phases(r["scenario"], data["duration"])
        d = digest(summary, sum(ph[1] for ph in phases), window,
                   WORKLOADS[r["workload"]].slo_ms, drop_of(r["scenario"], phases, mus[r["workload"]]))
        d["load_avg"] = r["digest"].get("load_avg")
        r["digest"] = d
        results.setdefault((r["workload"], r["scenario"], r["variant"]), []).append(d)
    text = table(results, mus)
    print(text)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    if args.plot:
        plots(args.plot, results, data["runs"], mus, workloads, variants, loads, scenarios)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crewd", default="build/service/crewd")
    p.add_argument("--loadgen", default="build/bench/loadgen/loadgen")
    p.add_argument("--workloads", default="W1,W2,W3,W4")
    p.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    p.add_argument("--loads", default="0.5,1,2,4")
    p.add_argument("--scenarios", default="steady,step,spike",
                   help="steady (each --loads), step, spike; W4 runs its drop instead of steady")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=20, help="seconds of each run")
    p.add_argument("--mu", default="", help="W1=480,W2=760: skip the ramp for these")
    p.add_argument("--crewd-cpus", default="0")
    p.add_argument("--loadgen-cpus", default="1")
    p.add_argument("--nice", type=int, default=-10,
                   help="crewd's nice value: it shares its CPU with the machine's other work")
    p.add_argument("--no-rt", action="store_true",
                   help="run loadgen without SCHED_FIFO (chrt -f 10)")
    p.add_argument("--limit-metric", default='crew_admission_limit{pool="jobs"}',
                   help="the gauge sampled as the admission limit (absent today)")
    p.add_argument("--add-variant", action="append", nargs=2, default=[],
                   metavar=("NAME", "FLAGS"),
                   help="one more variant: crewd's flags as one string, e.g. --add-variant "
                        "nice0 '--jobs-worker-nice 0' (name it in --variants too)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="build/bench-overload")
    p.add_argument("--plot", default="")
    p.add_argument("--retable", action="store_true",
                   help="no runs: the table and plots again from OUT (runs.json, the runs' JSON)")
    args = p.parse_args()
    args.loadgen_prefix = [] if args.no_rt else ["chrt", "-f", "10"]
    args.mu_guess = {"W1": 500, "W2": 800, "W3": 500, "W4": 800}
    os.makedirs(args.out, exist_ok=True)
    # The harness (and its scraper) stays off crewd's CPU.
    os.sched_setaffinity(0, {int(c) for c in args.loadgen_cpus.split(",")})

    workloads = args.workloads.split(",")
    loads = [float(x) for x in args.loads.split(",")]
    scenarios = args.scenarios.split(",")
    added = [(name, "added: " + flags, flags.split()) for name, flags in args.add_variant]
    variants = [v for v in VARIANTS + added if v[0] in args.variants.split(",")]
    for name, what, flags in variants:
        if flags is None:
            print(f"variant {name} ({what}): not available in this crewd, skipped")
    variants = [v for v in variants if v[2] is not None]

    if args.retable:
        retable(args, workloads, [v[0] for v in variants], loads, scenarios)
        return

    given = dict(kv.split("=") for kv in args.mu.split(",") if kv)
    mus, ramps = {}, {}
    for w in workloads:
        if w in given:
            mus[w] = float(given[w])
        else:
            mus[w], ramps[w] = measure_mu(args, WORKLOADS[w])
        print(f"{w}: mu = {mus[w]:.0f} requests/s", flush=True)

    labels = []  # (workload, scenario label)
    for w in workloads:
        for scen in scenarios:
            if w == "W4":  # at 0.8 mu before the drop, 3.2 mu after it
                if scen == "steady":
                    labels.append((w, "drop 0.8x"))
            elif scen == "steady":
                labels += [(w, f"steady {load:g}x") for load in loads]
            else:
                labels.append((w, scen))
    plan = [(w, label, *label_phases(label, args.duration)) for w, label in labels]

    results, raw = {}, []
    started = time.time()

    def save():  # after every run: an interrupted run can still be retabled
        with open(os.path.join(args.out, "runs.json"), "w") as f:
            json.dump({"mu": mus, "rounds": args.rounds, "duration": args.duration,
                       "minutes": (time.time() - started) / 60, "load_avg_end": os.getloadavg(),
                       "ramps": {w: r["per_second"] for w, r in ramps.items()},
                       "runs": raw}, f, indent=1)

    for rnd in range(args.rounds):
        for w, label, phases, window in plan:
            for name, _, flags in variants:
                load_avg = os.getloadavg()[0]
                tag = f"{w}-{label.replace(' ', '_')}-{name}-r{rnd}"
                summary = one_run(args, WORKLOADS[w], flags, phases, mus[w], tag)
                seconds = sum(ph[1] for ph in phases)
                if "error" in summary:
                    print(f"{tag}: crewd did not start: {summary['error']}")
                    d = summary
                else:
                    d = digest(summary, seconds, window, WORKLOADS[w].slo_ms,
                               drop_of(label, phases, mus[w]))
                    d["load_avg"] = load_avg
                    print(f"{tag}: load {load_avg:.1f} offered {d['offered_per_s']:.0f}/s "
                          f"goodput {d['goodput_per_s']:.0f}/s p99 {d['p99_ms']:.1f} ms "
                          f"rejected {d['rejected']} (p99 {fmt(d['rejection_p99_ms'], 2)} ms) "
                          f"late {d['late_sends']} recovery {fmt(d['recovery_s'], 0)}",
                          flush=True)
                results.setdefault((w, label, name), []).append(d)
                raw.append({"tag": tag, "round": rnd, "workload": w, "scenario": label,
                            "variant": name, "digest": d,
                            "per_second": summary.get("per_second"),
                            "metrics": summary.get("metrics")})
                save()
    text = table(results, mus)
    print()
    print(text)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    save()
    if args.plot:
        plots(args.plot, results, raw, mus, workloads, [v[0] for v in variants], loads, scenarios)


if __name__ == "__main__":
    main()

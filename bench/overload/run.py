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
crewd's start and its /metrics scraper are in crewd_process.py, a run's
digest and the table in digest.py, the plots in plots.py.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from crewd_process import Scraper, crewd_port
from digest import digest, fmt, table
from plots import plots

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

# Each workload's latency objective by name, for the plots.
SLO_MS = {name: w.slo_ms for name, w in WORKLOADS.items()}

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
# deadline-aware admission). The other two turn it off. "defaults" also
# runs the jobs workers as crewd did before the overload work: level with
# the I/O threads, with the system's time slice (jobs.worker_nice and
# jobs.worker_slice_us 0).
NO_CONTROLLER = ["--jobs-overload", "false"]
VARIANTS = [
    ("defaults", "defaults before the controller (jobs.queue 1024, jobs.queue_timeout_ms 5000, "
                 "jobs workers level with the I/O threads)",
     [*NO_CONTROLLER, "--jobs-worker-nice", "0", "--jobs-worker-slice-us", "0"]),
    ("fixed", "fixed limit for W1: jobs.queue 16, jobs.queue_timeout_ms 45",
     ["--jobs-queue", "16", "--jobs-queue-timeout-ms", "45", *NO_CONTROLLER]),
    ("codel", "CoDel dequeue drop alone (jobs.overload_adaptive_limit false)",
     ["--jobs-overload-adaptive-limit", "false"]),
    ("controller", "full controller: adaptive limit from the head, CoDel, deadline-aware "
                   "admission (crewd's defaults)", []),
    ("fifo", "the controller with real-time I/O threads (http.io_policy fifo; needs "
             "CAP_SYS_NICE)", ["--http-io-policy", "fifo"]),
]

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
        plots(args.plot, results, data["runs"], mus, workloads, variants, loads, scenarios,
              SLO_MS)


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
        plots(args.plot, results, raw, mus, workloads, [v[0] for v in variants], loads, scenarios,
              SLO_MS)


if __name__ == "__main__":
    main()

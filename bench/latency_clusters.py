#!/usr/bin/env python3
"""The stalls behind a latency run's tail: reads the per-task traces that
`crew_bench --workload latency --latency-trace DIR` writes (one line per
task, in the order sent: intended send time, scheduling latency, how late
the producer posted, the CPU the task started on) and groups the late tasks
(scheduling latency above --late-us) into clusters: runs of late tasks at
most --gap tasks apart, each one stall of the pool or the machine.

For each trace it prints how many tasks were late, how many clusters they
form and how big they are, how far apart the clusters start (a stall with a
period, such as a timer's, shows as a peak of the intervals), how late the
producer was when a cluster began (a stall that took the producer's CPU as
well, such as a descheduled virtual machine), and how often the cluster's
first task ran on another CPU than the task before it (a hand-over between
workers).

  python3 bench/latency_clusters.py [--late-us 10] [--gap 3] TRACE.tsv...

The p99 of a run is set by these clusters once they hold 1 % of its tasks:
at 100k tasks/s, 1,000 late tasks a second.
"""
import argparse
import statistics
import sys


def read_trace(path):
    tasks = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            intended, sched, late, cpu = line.split("\t")
            tasks.append((float(intended), float(sched), float(late), int(cpu)))
    if not tasks:
        sys.exit(f"{path}: no tasks")
    return tasks


def percentiles(values, qs):
    v = sorted(values)
    return [v[min(len(v) - 1, int(q * len(v)))] for q in qs]


def clusters_of(tasks, late_us, gap):
    out = []
    for i, t in enumerate(tasks):
        if t[1] <= late_us:
            continue
        if out and i - out[-1][-1] <= gap:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def summarize(path, late_us, gap):
    tasks = read_trace(path)
    n = len(tasks)
    seconds = (tasks[-1][0] - tasks[0][0]) / 1e6 or 1.0
    clusters = clusters_of(tasks, late_us, gap)
    late = sum(len(c) for c in clusters)
    print(f"{path}: {n:,} tasks over {seconds:.2f} s; {late:,} late (> {late_us:g} us, "
          f"{100 * late / n:.2f} %) in {len(clusters):,} clusters "
          f"({len(clusters) / seconds:,.0f} a second)")
    cpus = {}
    for t in tasks:
        cpus[t[3]] = cpus.get(t[3], 0) + 1
    print("  tasks by CPU: " + ", ".join(f"{c}: {100 * k / n:.1f} %"
                                          for c, k in sorted(cpus.items())))
    if not clusters:
        return
    sizes = [len(c) for c in clusters]
    worst = [max(tasks[i][1] for i in c) for c in clusters]
    print(f"  cluster size (tasks) p50 / p90 / max: "
          f"{' / '.join(str(x) for x in percentiles(sizes, [0.5, 0.9]))} / {max(sizes)}")
    print(f"  worst scheduling latency in a cluster, us, p50 / p90 / max: "
          f"{' / '.join(f'{x:.1f}' for x in percentiles(worst, [0.5, 0.9]))} / {max(worst):.1f}")
    starts = [tasks[c[0]][0] for c in clusters]
    if len(starts) > 1:
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        print(f"  us between cluster starts p10 / p25 / p50 / p75 / p90: "
              f"{' / '.join(f'{x:,.0f}' for x in percentiles(gaps, [0.1, 0.25, 0.5, 0.75, 0.9]))}")
    producer_late = [tasks[c[0]][2] for c in clusters]
    print(f"  producer lateness at a cluster's first task, us, p50 / p90: "
          f"{' / '.join(f'{x:.1f}' for x in percentiles(producer_late, [0.5, 0.9]))}")
    handed = sum(1 for c in clusters if c[0] > 0 and tasks[c[0]][3] != tasks[c[0] - 1][3])
    print(f"  clusters whose first task ran on another CPU than the task before: "
          f"{handed:,} of {len(clusters):,}")
    print(f"  median scheduling latency of all tasks: "
          f"{statistics.median(t[1] for t in tasks):.2f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--late-us", type=float, default=10.0,
                    help="a task is late above this scheduling latency (default 10)")
    ap.add_argument("--gap", type=int, default=3,
                    help="late tasks at most this many tasks apart are one cluster (default 3)")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    if a.late_us <= 0 or a.gap < 1:
        sys.exit("--late-us must be positive and --gap at least 1")
    for path in a.traces:
        summarize(path, a.late_us, a.gap)


if __name__ == "__main__":
    main()

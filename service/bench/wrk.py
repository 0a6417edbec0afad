#!/usr/bin/env python3
"""What the compute pool costs crewd: wrk against GET /api/v1/factorial/20 with
factorials on the pool as configured by default (a waiting handler helps run
the pool's queue), on the pool with every factorial crossing to a compute
worker (compute.help=false), and on the connection's thread
(compute.inline_factorial=true). The three are interleaved over rounds
because the cost of crossing cores on a shared VM drifts over minutes. Prints
each run, the medians as a Markdown table and the median of the per-round
ratios (README.md and docs/crewd.md, "Figures").

  python3 service/bench/wrk.py [--crewd build/service/crewd] [--rounds 3]
                               [--threads 2] [--connections 64] [--duration 10]

Each run starts a fresh crewd on a free loopback port and stops it with
SIGTERM. Needs wrk (Debian package wrk; scripts/deps.sh bench).
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time

# mode -> crewd flags
MODES = {
    "pool": [],
    "hop": ["--compute-help", "false"],
    "inline": ["--compute-inline-factorial", "true"],
}
LABELS = {
    "pool": "compute pool (default: waiting handlers help)",
    "hop": "compute pool, every task on a compute worker (`compute.help=false`)",
    "inline": "connection's thread (`compute.inline_factorial=true`)",
}


def port_of(crewd, flags):
    # At the default log level (info) crewd logs its port and nothing per
    # request (the request log is at debug).
    proc = subprocess.Popen(
        [crewd, "--listen", "127.0.0.1:0", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on http://[^:]+:([0-9]+)", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    sys.exit("crewd did not start")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def to_ms(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s)", text)
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def run_wrk(port, a):
    cmd = ["wrk", f"-t{a.threads}", f"-c{a.connections}", f"-d{a.duration}s", "--latency",
           f"http://127.0.0.1:{port}/api/v1/factorial/20"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.duration + 60,
                         check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    p50 = to_ms(re.search(r"\s50%\s+([0-9.]+\w+)", out).group(1))
    p99 = to_ms(re.search(r"\s99%\s+([0-9.]+\w+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: ([0-9]+)", out)
    if errors:
        sys.exit(f"wrk saw {errors.group(1)} non-2xx responses:\n{out}")
    return rps, p50, p99


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crewd", default="build/service/crewd")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--duration", type=int, default=10)
    a = ap.parse_args()

    results = {m: [] for m in MODES}
    for r in range(a.rounds):
        # Alternate which mode goes first, so neither always runs warm.
        order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
        for mode in order:
            proc, port = port_of(a.crewd, MODES[mode])
            try:
                rps, p50, p99 = run_wrk(port, a)
            finally:
                stop(proc)
            results[mode].append((rps, p50, p99))
            print(f"round {r + 1} {mode:6}: {rps:10.0f} req/s  p50 {p50:.3f} ms  p99 {p99:.3f} ms",
                  flush=True)

    med = {m: tuple(statistics.median(x[i] for x in results[m]) for i in range(3))
           for m in MODES}
    ratio = {m: statistics.median(results[m][r][0] / results["inline"][r][0]
                                  for r in range(a.rounds)) for m in ("pool", "hop")}
    print()
    print(f"wrk -t{a.threads} -c{a.connections} -d{a.duration}s --latency, "
          f"GET /api/v1/factorial/20, {a.rounds} interleaved rounds, medians "
          f"({os.cpu_count()} CPUs):")
    print()
    print("| factorial on | requests/s | p50 | p99 | / inline |")
    print("|---|--:|--:|--:|--:|")
    for m in MODES:
        rps, p50, p99 = med[m]
        r = f"{ratio[m]:.3f}" if m in ratio else "1"
        print(f"| {LABELS[m]} | {rps:,.0f} | {p50:.2f} ms | {p99:.2f} ms | {r} |")
    print()
    for m in ("pool", "hop"):
        print(f"{m} / inline throughput, median of per-round ratios: {ratio[m]:.3f} "
              f"(costs {100 * (1 - ratio[m]):.1f} %)")


if __name__ == "__main__":
    main()

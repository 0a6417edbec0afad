#!/usr/bin/env python3
"""What the compute pool costs crewd, and what the front door holds: wrk
against GET /api/v1/factorial/20 with factorials on the compute pool (the
default: the I/O thread hands each one to the pool and resumes when it is
done), on the pool with compute.worker_policy=normal (woken workers
preempt the I/O thread), and on the connection's I/O thread
(compute.inline_factorial=true), interleaved over rounds because the cost
of crossing cores on a shared VM drifts over minutes; then the default at
-c64 and -c1000 back to back on one crewd (socket errors, the throughput
ratio); then pool and inline at a moderate load (-c8, --few), where a
compute worker that keeps its CPU shows in the tail and not in the
throughput. With --baseline, another crewd binary (say the one before a
change) is measured in the same rounds (pool and inline), for a
before/after beside each other. Prints each run, the medians as a Markdown table (with the socket
errors and non-2xx responses of all rounds) and the median of the
per-round ratios (README.md and docs/crewd.md, "Figures"). Beside the
throughput, each run reads crewd's CPU time per request from /proc (all of
its threads, and the compute workers' share): wrk shares the machine, so
the CPU a request costs crewd is what the throughput ratio follows, and it
moves less with the machine's state than requests/s do.

  python3 service/bench/wrk.py [--crewd build/service/crewd] [--baseline OTHER_CREWD]
                               [--rounds 3] [--threads 2] [--connections 64]
                               [--many 1000] [--few 8] [--duration 10]

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
    "normal": ["--compute-worker-policy", "normal"],
    "inline": ["--compute-inline-factorial", "true"],
}
LABELS = {
    "pool": "compute pool (default)",
    "normal": "compute pool, workers preempt (`compute.worker_policy=normal`)",
    "inline": "connection's I/O thread (`compute.inline_factorial=true`)",
}
# Modes a --baseline crewd runs (one from before compute.worker_policy
# would refuse the flag).
BASELINE_MODES = ("pool", "inline")


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


def cpu_seconds(pid):
    """CPU time (user + system) of each thread of `pid`, summed by thread
    name without its number: {"crewd-io": s, "compute": s, ...}."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    task_dir = f"/proc/{pid}/task"
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # the thread exited meanwhile
            continue
        name = re.sub(r"[-0-9]+$", "", stat[stat.index("(") + 1:stat.rindex(")")])
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def run_wrk(port, a, connections):
    cmd = ["wrk", f"-t{a.threads}", f"-c{connections}", f"-d{a.duration}s", "--latency",
           f"http://127.0.0.1:{port}/api/v1/factorial/20"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.duration + 60,
                         check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
    p50 = to_ms(re.search(r"\s50%\s+([0-9.]+\w+)", out).group(1))
    p99 = to_ms(re.search(r"\s99%\s+([0-9.]+\w+)", out).group(1))
    # Counted, not fatal: a run on a machine shared with other load may see
    # a stall; the figures say so.
    non2xx = re.search(r"Non-2xx or 3xx responses: ([0-9]+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    socket_errors = sum(int(x) for x in sock.groups()) if sock else 0
    return rps, p50, p99, socket_errors + (int(non2xx.group(1)) if non2xx else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crewd", default="build/service/crewd")
    ap.add_argument("--baseline", help="another crewd binary, measured in the same rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--many", type=int, default=1000, help="connections of the extra run (0: none)")
    ap.add_argument("--few", type=int, default=8,
                    help="connections of the moderate-load runs, pool and inline (0: none)")
    ap.add_argument("--duration", type=int, default=10)
    a = ap.parse_args()

    runs = [("", m) for m in MODES]
    if a.baseline:
        runs += [("before", m) for m in BASELINE_MODES]
    results = {r: [] for r in runs}
    many = []
    few = {"pool": [], "inline": []}
    for r in range(a.rounds):
        # Alternate the order, so that none always runs warm.
        order = runs if r % 2 == 0 else list(reversed(runs))
        for tag, mode in order:
            binary = a.baseline if tag else a.crewd
            proc, port = port_of(binary, MODES[mode])
            try:
                before = cpu_seconds(proc.pid)
                rps, p50, p99, errs = run_wrk(port, a, a.connections)
                after = cpu_seconds(proc.pid)
            finally:
                stop(proc)
            requests = rps * a.duration
            used = {k: v - before.get(k, 0.0) for k, v in after.items()}
            cpu_us = sum(used.values()) / requests * 1e6
            compute_us = used.get("compute", 0.0) / requests * 1e6
            results[(tag, mode)].append((rps, p50, p99, cpu_us, compute_us, errs))
            print(f"round {r + 1} {tag or 'crewd':6} {mode:6}: {rps:10.0f} req/s  p50 {p50:.3f} ms"
                  f"  p99 {p99:.3f} ms  crewd CPU {cpu_us:.2f} us/request (compute workers"
                  f" {compute_us:.2f})  errors (socket, non-2xx) {errs}", flush=True)
        if a.many:
            # -c64 and -c1000 back to back on one crewd (the order alternating),
            # so that their ratio does not see the machine drift between rounds.
            proc, port = port_of(a.crewd, MODES["pool"])
            pair = {}
            try:
                for c in ([a.connections, a.many] if r % 2 == 0 else [a.many, a.connections]):
                    pair[c] = run_wrk(port, a, c)
            finally:
                stop(proc)
            many.append(pair[a.many] + (pair[a.many][0] / pair[a.connections][0],))
            for c in (a.connections, a.many):
                rps, p50, p99, errs = pair[c]
                print(f"round {r + 1} crewd  pool  -c{c} (pair): {rps:10.0f} req/s  p50 {p50:.3f}"
                      f" ms  p99 {p99:.3f} ms  errors (socket, non-2xx) {errs}", flush=True)

        if a.few:
            # Pool and inline at a moderate load, the order alternating.
            for mode in (["pool", "inline"] if r % 2 == 0 else ["inline", "pool"]):
                proc, port = port_of(a.crewd, MODES[mode])
                try:
                    rps, p50, p99, errs = run_wrk(port, a, a.few)
                finally:
                    stop(proc)
                few[mode].append((rps, p50, p99, errs))
                print(f"round {r + 1} crewd  {mode:6} -c{a.few}: {rps:10.0f} req/s  p50 {p50:.3f}"
                      f" ms  p99 {p99:.3f} ms  errors (socket, non-2xx) {errs}", flush=True)

    med = {k: tuple(statistics.median(x[i] for x in v) for i in range(5))
           for k, v in results.items()}
    ratio = {k: statistics.median(results[k][r][0] / results[(k[0], "inline")][r][0]
                                  for r in range(a.rounds)) for k in results}
    p99_ratio = {k: statistics.median(results[k][r][2] / results[(k[0], "inline")][r][2]
                                      for r in range(a.rounds)) for k in results}
    print()
    print(f"wrk -t{a.threads} -c{a.connections} -d{a.duration}s --latency, "
          f"GET /api/v1/factorial/20, {a.rounds} interleaved rounds, medians "
          f"({os.cpu_count()} CPUs):")
    print()
    print("| crewd | factorial on | requests/s | p50 | p99 | / inline | p99 / inline "
          "| crewd CPU per request (compute workers) | errors |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for k in runs:
        rps, p50, p99, cpu_us, compute_us = med[k]
        errors = sum(x[5] for x in results[k])
        print(f"| {k[0] or 'this'} | {LABELS[k[1]]} | {rps:,.0f} | {p50:.2f} ms | {p99:.2f} ms | "
              f"{ratio[k]:.3f} | {p99_ratio[k]:.2f} | {cpu_us:.2f} µs ({compute_us:.2f}) | "
              f"{errors} |")
    if many:
        rps = statistics.median(x[0] for x in many)
        print()
        print(f"-c{a.many} (pool): {rps:,.0f} req/s median, p50 "
              f"{statistics.median(x[1] for x in many):.2f} ms, p99 "
              f"{statistics.median(x[2] for x in many):.2f} ms, errors (socket, non-2xx) "
              f"{[x[3] for x in many]}; / -c{a.connections} on the same crewd just before or "
              f"after: {statistics.median(x[4] for x in many):.3f} (median of "
              f"{[round(x[4], 3) for x in many]})")
    if a.few:
        pool, inline = few["pool"], few["inline"]
        print()
        print(f"-c{a.few}: pool {statistics.median(x[0] for x in pool):,.0f} req/s, p99 "
              f"{statistics.median(x[2] for x in pool):.2f} ms; inline "
              f"{statistics.median(x[0] for x in inline):,.0f} req/s, p99 "
              f"{statistics.median(x[2] for x in inline):.2f} ms; pool / inline: requests/s "
              f"{statistics.median(p[0] / i[0] for p, i in zip(pool, inline)):.3f}, p99 "
              f"{statistics.median(p[2] / i[2] for p, i in zip(pool, inline)):.2f} (medians of "
              f"per-round ratios); errors (socket, non-2xx) "
              f"{sum(x[3] for x in pool + inline)}")


if __name__ == "__main__":
    main()

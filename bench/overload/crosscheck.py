#!/usr/bin/env python3
"""loadgen against httperf --period=e (Debian's httperf, open-loop with
exponential inter-arrival times) at one rate: the same crewd (W2's job,
sleep 20 ms on 16 workers, far below capacity), each tool in turn for
--rounds rounds. Prints each run's request rate and mean latency, and the
medians; the two should agree within --rate-tolerance (relative) and
--latency-tolerance-ms (docs/bench/overload.md, "Cross-check").

httperf opens a connection per request here (one call per session), loadgen
keeps its connections: the server's 20 ms dominate both latencies, and
loopback's connect adds a few tens of microseconds. httperf's latency is
its reply time from the request's send; loadgen's is from the scheduled
send time, and its time from the actual send is printed beside it.

  python3 bench/overload/crosscheck.py [--rate 200] [--seconds 20] [--rounds 3]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (crewd's start and stop)

JOB = {"kind": "sleep", "ms": 20, "timeout_ms": 1000}


def httperf(args, port, workdir):
    sess = os.path.join(workdir, "session")
    with open(sess, "w") as f:
        f.write(f"/api/v1/jobs method=POST contents='{json.dumps(JOB, separators=(',', ':'))}'\n")
    n = int(args.rate * args.seconds)
    out = subprocess.run(
        [*args.prefix, "taskset", "-c", args.loadgen_cpus, "httperf", "--server", "127.0.0.1",
         "--port", str(port), f"--wsesslog={n},0,{sess}", f"--period=e{1 / args.rate:.6f}",
         "--add-header=Content-Type: application/json\\n"],
        capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Request rate: ([0-9.]+)", out).group(1))
    reply = float(re.search(r"Reply time \[ms\]: response ([0-9.]+)", out).group(1))
    ok = int(re.search(r"2xx=([0-9]+)", out).group(1))
    return {"rate": rate, "mean_ms": reply, "ok": ok, "sent": n}


def loadgen(args, port, workdir, seed):
    out = os.path.join(workdir, "loadgen.json")
    subprocess.run(
        [*args.prefix, "taskset", "-c", args.loadgen_cpus, args.loadgen, "--url",
         f"http://127.0.0.1:{port}/api/v1/jobs", "--header", "Content-Type: application/json",
         "--body", json.dumps(JOB, separators=(",", ":")), "--rate", str(args.rate),
         "--duration", str(args.seconds), "--seed", str(seed), "--quiet", "--json", out],
        check=True)
    with open(out) as f:
        s = json.load(f)
    return {"rate": s["achieved_rate"], "mean_ms": s["latency_ms"]["mean"],
            "service_mean_ms": s["service_ms"]["mean"], "ok": s["status"].get("200", 0),
            "sent": s["sent"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crewd", default="build/service/crewd")
    p.add_argument("--loadgen", default="build/bench/loadgen/loadgen")
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--crewd-cpus", default="0")
    p.add_argument("--loadgen-cpus", default="1")
    p.add_argument("--nice", type=int, default=-10)
    # Each tool draws its own Poisson arrivals: 4,000 of them have a mean
    # gap within 1.6 % (one standard deviation) of 1/rate, the difference
    # of two such means 2.2 %.
    p.add_argument("--rate-tolerance", type=float, default=0.05)
    p.add_argument("--latency-tolerance-ms", type=float, default=1.0)
    args = p.parse_args()
    args.prefix = ["chrt", "-f", "10"]
    cmd = ["nice", "-n", str(args.nice), "taskset", "-c", args.crewd_cpus, args.crewd,
           "--listen", "127.0.0.1:0", "--jobs-workers", "16"]
    results = {"httperf": [], "loadgen": []}
    with tempfile.TemporaryDirectory() as workdir:
        for rnd in range(args.rounds):
            for tool, fn in (("httperf", httperf),
                             ("loadgen", lambda *a, s=rnd + 1: loadgen(*a, s))):
                proc, port = run.crewd_port(cmd, args.nice)
                if proc is None:
                    sys.exit(f"crewd did not start: {port}")
                try:
                    r = fn(args, port, workdir)
                finally:
                    run.stop(proc)
                r["load_avg"] = os.getloadavg()[0]
                results[tool].append(r)
                print(f"round {rnd} {tool}: {json.dumps(r)}", flush=True)
    med = {t: {k: statistics.median(r[k] for r in rs) for k in ("rate", "mean_ms")}
           for t, rs in results.items()}
    rate_diff = abs(med["loadgen"]["rate"] - med["httperf"]["rate"]) / med["httperf"]["rate"]
    lat_diff = abs(med["loadgen"]["mean_ms"] - med["httperf"]["mean_ms"])
    print(f"medians: {json.dumps(med)}")
    print(f"rate differs by {rate_diff * 100:.2f} % (tolerance {args.rate_tolerance * 100:g} %), "
          f"mean latency by {lat_diff:.2f} ms (tolerance {args.latency_tolerance_ms:g} ms)")
    ok = rate_diff <= args.rate_tolerance and lat_diff <= args.latency_tolerance_ms
    print("agree" if ok else "DISAGREE")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

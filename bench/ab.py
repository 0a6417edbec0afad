#!/usr/bin/env python3
"""Runs two crew_bench binaries round by round and compares per-round ratios.

Usage and method: see bench/ab.sh, which runs this. Python standard library only.
"""

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_WORKLOADS = "short_detached,short_future,producers_4,factorial,group_wait,fib,skynet"
# The extras crew_bench adds after the rounds or per configuration that the
# comparison does not read: the idle-CPU window and the fork-join stack run.
DEFAULT_EXTRA = ["--idle-seconds", "0", "--fj-stack", "0"]
BAND = (0.97, 1.03)


def parse_args(argv):
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="bench/ab.sh",
                                description="A/B comparison of two crew_bench binaries")
    p.add_argument("--before", required=True, help="the baseline crew_bench")
    p.add_argument("--after", required=True, help="the crew_bench under test")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    p.add_argument("--impl", default="crew")
    p.add_argument("--out", help="keep each run's JSON here")
    p.add_argument("--run-timeout", type=float, default=300,
                   help="a run still going after this many seconds counts as failed")
    args = p.parse_args(argv)
    args.extra = extra
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    for side in ("before", "after"):
        path = getattr(args, side)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            p.error(f"--{side} {path}: not an executable file")
    args.workloads = [w for w in args.workloads.split(",") if w]
    return args


def run_once(binary, impl, workload, extra, json_path, timeout):
    """(ns_per_task, "") of one single-round crew_bench run, or (None, why)."""
    cmd = [binary, "--impl", impl, "--workload", workload, "--rounds", "1",
           *DEFAULT_EXTRA, *extra, "--json", str(json_path)]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"still running after {timeout:g} s, killed"
    if proc.returncode != 0:
        # crew_bench's own complaint, not the usage text after it.
        lines = proc.stderr.strip().splitlines()
        said = [l for l in lines if l.startswith("crew_bench: ")] or lines[-1:] or [""]
        return None, f"exit {proc.returncode}: {said[-1]}"
    try:
        with open(json_path, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"no JSON: {e}"
    for e in entries:
        if e.get("impl") == impl and e.get("workload") == workload:
            if "skipped" in e:
                return None, f"skipped: {e['skipped']}"
            if "ns_per_task" not in e:
                return None, e.get("failure", "no ns_per_task")
            return float(e["ns_per_task"]), ""
    return None, "no entry for this workload"


def fmt_ns(v):
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def main():
    args = parse_args(sys.argv[1:])
    print("command: " + " ".join(shlex.quote(a) for a in ["bench/ab.sh", *sys.argv[1:]]))
    print("date:    " + datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
    # Other processes on the cores widen the ratios' spread more than anything else.
    print("load:    %.2f %.2f %.2f (1, 5, 15 min) at the start" % os.getloadavg())
    print(f"each run: {{before|after}} --impl {args.impl} --workload W --rounds 1 "
          + " ".join(shlex.quote(a) for a in DEFAULT_EXTRA + args.extra) + " --json FILE")
    sys.stdout.flush()

    tmp = None
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="crew-ab-")
        out = Path(tmp.name)

    sides = {"before": args.before, "after": args.after}
    ns = {w: {"before": [], "after": []} for w in args.workloads}  # per round, None = failed
    failures = []
    for r in range(args.rounds):
        start = time.monotonic()
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for w in args.workloads:
            for side in order:
                value, why = run_once(sides[side], args.impl, w, args.extra,
                                      out / f"{w}-{side}-r{r + 1}.json", args.run_timeout)
                ns[w][side].append(value)
                if value is None:
                    failures.append(f"round {r + 1}, {w}, {side}: {why}")
        print(f"ab: round {r + 1}/{args.rounds} took {time.monotonic() - start:.1f} s, "
              f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)

    print()
    header = ("workload", "before ns/task", "after ns/task", "ratio median", "min", "max",
              "within 0.97-1.03", "rounds")
    rows = []
    for w in args.workloads:
        b, a = ns[w]["before"], ns[w]["after"]
        ratios = [y / x for x, y in zip(b, a) if x is not None and y is not None and x > 0]
        bs, as_ = [x for x in b if x is not None], [y for y in a if y is not None]
        if ratios:
            med = statistics.median(ratios)
            verdict = "yes" if BAND[0] <= med <= BAND[1] else "no"
            rows.append((w, fmt_ns(statistics.median(bs)), fmt_ns(statistics.median(as_)),
                         f"{med:.3f}", f"{min(ratios):.3f}", f"{max(ratios):.3f}", verdict,
                         f"{len(ratios)}/{args.rounds}"))
        else:
            rows.append((w, fmt_ns(statistics.median(bs) if bs else None),
                         fmt_ns(statistics.median(as_) if as_ else None),
                         "—", "—", "—", "—", f"0/{args.rounds}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(  # noqa: E731
        c.ljust(wd) if i == 0 else c.rjust(wd) for i, (c, wd) in enumerate(zip(cells, widths))
    ) + " |"
    print(line(header))
    print("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    for row in rows:
        print(line(row))

    print("\nper-round ratios after/before:")
    for w in args.workloads:
        per_round = [("—" if x is None or y is None or x <= 0 else f"{y / x:.3f}")
                     for x, y in zip(ns[w]["before"], ns[w]["after"])]
        print(f"  {w}: {' '.join(per_round)}")
    print("\nload:    %.2f %.2f %.2f (1, 5, 15 min) at the end" % os.getloadavg())
    if failures:
        print("\nfailed runs:")
        for f in failures:
            print("  " + f)
    if args.out:
        print(f"\nrun JSON kept in {out}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

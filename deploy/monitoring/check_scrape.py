#!/usr/bin/env python3
"""Checks that every metric the monitoring kit reads is one crewd exports.

  check_scrape.py --crewd BUILD/service/crewd --rules rules --dashboard dashboards/crewd.json
                  [--redis-server /usr/bin/redis-server] [--promtool /usr/bin/promtool]

Collects the metric names used in the expressions of the rule files
(rules/*.yml) and of the dashboard (its panels' targets and its variables'
queries), then starts a real crewd on a free loopback port (with
--redis-server: a redis-server on another free port first, and crewd
consuming from it), sends it a few requests, scrapes /metrics and checks:
  - crewd_ready is 1 while /readyz answers 200 (and, with Redis, 0 with
    /readyz 503 once the redis-server is stopped);
  - every name used is a sample name of the scrape (histograms are exposed
    as _bucket, _sum and _count), a recording rule of the rule files, or
    one Prometheus makes itself (up);
  - without Redis, names of crewd_redis_* are reported as not checked;
  - promtool check metrics finds nothing in the scrape (with --promtool).

Exit 0 when every check passes, 1 otherwise. Every process and request is
bounded by a timeout. Needs PyYAML (Debian python3-yaml).
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import yaml

# Made by Prometheus for every target, never exported.
SYNTHETIC = {"up"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}
REDIS_PREFIX = "crewd_redis_"
failures = []


def check(ok, message):
    print(("ok    " if ok else "FAIL  ") + message)
    if not ok:
        failures.append(message)
    return ok


def metric_names(expr):
    """The metric names a PromQL expression (or a Grafana label_values()
    query) selects."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)             # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)                        # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                       # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"label_values\(\s*([^,)]+)(,[^)]*)?\)", r"\1", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)                      # dashboard variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)\s*(\()?", expr):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        names.add(name)
    return names


def used_names(rules_dir, dashboard):
    """{name: [where used]} and the recording rules' names."""
    used, records = {}, set()
    for fn in sorted(os.listdir(rules_dir)):
        if not fn.endswith(".yml"):
            continue
        with open(os.path.join(rules_dir, fn), encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                if "record" in rule:
                    records.add(rule["record"])
                where = f"{fn}: {rule.get('record') or rule.get('alert')}"
                for n in metric_names(rule["expr"]):
                    used.setdefault(n, []).append(where)
    with open(dashboard, encoding="utf-8") as f:
        dash = json.load(f)
    panels = list(dash.get("panels", []))
    for p in list(panels):
        panels.extend(p.get("panels", []))
    for p in panels:
        for t in p.get("targets", []):
            for n in metric_names(t.get("expr", "")):
                used.setdefault(n, []).append(f"dashboard: {p.get('title')}")
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        if v.get("type") == "query":
            for n in metric_names(q):
                used.setdefault(n, []).append(f"dashboard: variable {v.get('name')}")
    return used, records


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(redis_server, workdir):
    port = free_port()
    proc = subprocess.Popen([redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=10)
    raise RuntimeError("redis-server did not answer within 10 s")


def start_crewd(crewd, extra):
    proc = subprocess.Popen([crewd, "--listen", "127.0.0.1:0"] + extra,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on http://[^ ]*:([0-9]+)", line)
        if m:
            # Keep reading its log, so that a full pipe never blocks it.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(m.group(1))
    stop(proc)
    raise RuntimeError("crewd did not say where it listens within 30 s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def get(port, path, data=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scraped_names(text):
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][\w:]*", line).group(0))
    return names


def sample_value(text, name):
    """The value of the unlabelled sample `name`, or None."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crewd", required=True)
    ap.add_argument("--rules", required=True, help="directory of rule files (*.yml)")
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--redis-server", default="", help="also check crewd consuming from Redis")
    ap.add_argument("--promtool", default="", help="run promtool check metrics on the scrape")
    a = ap.parse_args()

    used, records = used_names(a.rules, a.dashboard)
    print(f"{len(used)} names used in {a.rules} and {a.dashboard}; {len(records)} recording rules")
    with_redis = bool(a.redis_server) and os.access(a.redis_server, os.X_OK)
    if not with_redis:
        print(f"note: no redis-server ({a.redis_server or 'none given'}): "
              f"{REDIS_PREFIX}* names are not checked")

    with tempfile.TemporaryDirectory() as workdir:
        redis = None
        extra = []
        try:
            if with_redis:
                redis, redis_port = start_redis(a.redis_server, workdir)
                extra = ["--redis-address", f"127.0.0.1:{redis_port}"]
            proc, port = start_crewd(a.crewd, extra)
            try:
                # Requests that make the HTTP and task series appear.
                check(get(port, "/api/v1/factorial/20")[0] == 200, "GET /api/v1/factorial/20 is 200")
                get(port, "/api/v1/factorial/0x")  # a 400
                # With Redis, ready once connected.
                deadline = time.monotonic() + 15
                while get(port, "/readyz")[0] != 200 and time.monotonic() < deadline:
                    time.sleep(0.1)
                check(get(port, "/readyz")[0] == 200, "GET /readyz is 200")
                # The Redis stream gauges appear after the first poll (1 s).
                wanted = {n for n in used if n not in records and n not in SYNTHETIC}
                if not with_redis:
                    wanted = {n for n in wanted if not n.startswith(REDIS_PREFIX)}
                deadline = time.monotonic() + 15
                while True:
                    status, text = get(port, "/metrics")
                    names = scraped_names(text)
                    if wanted <= names or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                check(status == 200, "GET /metrics is 200")
                check(sample_value(text, "crewd_ready") == 1, "crewd_ready is 1 while /readyz is 200")
                if redis is not None:
                    # Redis gone: /readyz says 503, and so does crewd_ready.
                    stop(redis)
                    redis = None
                    deadline = time.monotonic() + 15
                    while (sample_value(get(port, "/metrics")[1], "crewd_ready") != 0 and
                           time.monotonic() < deadline):
                        time.sleep(0.1)
                    check(sample_value(get(port, "/metrics")[1], "crewd_ready") == 0 and
                          get(port, "/readyz")[0] == 503,
                          "crewd_ready is 0 and /readyz 503 once Redis is gone")
                print(f"scrape: {len(text.splitlines())} lines, {len(names)} names")
            finally:
                stop(proc)
        finally:
            if redis is not None:
                stop(redis)

    for n in sorted(used):
        where = "; ".join(sorted(set(used[n])))
        if n in records:
            print(f"ok    {n}: a recording rule ({where})")
        elif n in SYNTHETIC:
            print(f"ok    {n}: made by Prometheus ({where})")
        elif n.startswith(REDIS_PREFIX) and not with_redis:
            print(f"skip  {n}: needs Redis ({where})")
        else:
            check(n in names, f"{n} is in crewd's scrape ({where})")

    if a.promtool:
        out = subprocess.run([a.promtool, "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=60)
        report = (out.stdout + out.stderr).strip()
        check(out.returncode == 0 and not report, f"promtool check metrics is clean {report}")

    print(f"{'FAILED' if failures else 'PASSED'}: {len(failures)} failed checks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

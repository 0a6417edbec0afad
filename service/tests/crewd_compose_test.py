#!/usr/bin/env python3
"""Brings up the local stack of deploy/compose (`make compose`) and tears it down.

  - starts it with `scripts/compose.sh up` (what `make compose` runs) as its
    own project on free loopback ports, so that a stack already running on
    the machine is left alone; the crewd image gets its own tag, so that a
    crewd:0.1.0 built meanwhile from another checkout does not change the
    stack under test;
  - enqueues JOBS sleep jobs through instance crewd-a (`crewctl enqueue` run
    inside its container, to Redis by its service name) and requires a
    result with status ok for every one, from both crewd-a and crewd-b
    (each takes at most jobs.workers = 8 at a time, so neither can take
    them all), and each instance's crewd_redis_jobs_total{outcome=
    "succeeded"} above 0 on its own /metrics;
  - requires Prometheus to have both crewd targets up, to serve both
    instances' job counts from its scrapes, to accept its configuration with
    `promtool check config` (which also checks every rule file the glob
    loads), and to have loaded a rule group from each deploy/monitoring/rules
    /*.yml;
  - tears it down with `scripts/compose.sh down` and requires that no
    container, network or pod of the project is left.

  crewd_compose_test.py --repo REPO_ROOT

Figures printed: `up` to the first job done (required under 180 s when no
image was rebuilt), and `down`'s time. Exit 0: all checks pass; 1: a check
failed; 77: skipped, with the reason printed (no container engine or compose
tool able to run). With CI set (as .ci/run sets it), that is a failure, not
a skip. Every subprocess and wait is bounded; the stack is torn down at the
end, whatever happened.
"""
import argparse
import glob
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crewd_image_test as image  # noqa: E402  (Engine, http, wait_for, gauge, check)

SKIP = 77
UP_TIMEOUT_S = 2400  # a cold `up` builds three images
WARM_UP_TO_FIRST_JOB_S = 180
JOBS = 40
JOB_MS = 300
INSTANCES = {"crewd-a", "crewd-b"}
check = image.check


def in_ci():
    return os.environ.get("CI", "false") not in ("", "false", "0")


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (free when asked)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Stack:
    """scripts/compose.sh for one project, and its containers by label."""

    def __init__(self, repo, engine, project, env):
        self.script = os.path.join(repo, "scripts", "compose.sh")
        self.engine = engine
        self.project = project
        self.env = env
        self.label = f"label=com.docker.compose.project={project}"

    def compose(self, *args, timeout):
        return subprocess.run(["bash", self.script, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout)

    def container(self, service):
        out = self.engine.run("ps", "-q", "--filter", self.label, "--filter",
                              f"label=com.docker.compose.service={service}")
        ids = out.stdout.split()
        if len(ids) != 1:
            raise RuntimeError(f"{len(ids)} running containers of service {service}")
        return ids[0]

    def crewctl(self, *args):
        """crewctl run in crewd-a's container, to Redis by its service name."""
        return self.engine.run("exec", self.container("crewd-a"), "crewctl", "--redis",
                               "redis:6379", *args, timeout=60)

    def leftovers(self):
        """What the project still has: containers, networks, pods."""
        left = []
        left += ["container " + c for c in
                 self.engine.run("ps", "-a", "-q", "--filter", self.label).stdout.split()]
        left += ["network " + n for n in
                 self.engine.run("network", "ls", "--format", "{{.Name}}").stdout.split()
                 if n.startswith(self.project + "_")]
        if self.engine.run("--which").stdout.strip() == "podman":
            left += ["pod " + p for p in
                     self.engine.run("pod", "ls", "--format", "{{.Name}}").stdout.split()
                     if self.project in p]
        return left


def results(stack):
    """crewctl results: {job id: [fields of each result]}."""
    out = stack.crewctl("results", "--count", "0").stdout
    by_job = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "job" in fields:
            by_job.setdefault(fields["job"], []).append(fields)
    return by_job


def prometheus_get(base, path, **params):
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    status, body = image.http("GET", base + path + query)
    if status != 200:
        return None
    return json.loads(body).get("data")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    a = ap.parse_args()
    engine = image.Engine(a.repo)

    why = image.engine_usable(engine)
    if why is None:
        tool = subprocess.run(["bash", os.path.join(a.repo, "scripts", "compose.sh"), "--tool"],
                              capture_output=True, text=True, timeout=60)
        if tool.returncode != 0:
            why = f"no compose tool: {tool.stderr.strip()}"
    if why and in_ci():
        check(False, f"CI={os.environ['CI']}: a container engine and compose tool run ({why})")
        return 1
    if why:
        print(f"SKIP: {why}")
        return SKIP
    print(f"engine {engine.run('--which').stdout.strip()}, compose {tool.stdout.strip()}",
          flush=True)

    project = f"crewdtest{os.getpid()}"
    port_a, port_b, port_prom, port_redis = free_ports(4)
    env = dict(os.environ, COMPOSE_PROJECT_NAME=project, CREWD_A_PORT=str(port_a),
               CREWD_B_PORT=str(port_b), PROMETHEUS_PORT=str(port_prom),
               REDIS_PORT=str(port_redis), CREWD_IMAGE="crewd:compose-test")
    stack = Stack(a.repo, engine, project, env)
    try:
        run_checks(a.repo, stack, port_a, port_b, port_prom)
    finally:
        tear_down(stack)
    print(f"{len(image.failures)} checks failed" if image.failures else "all checks passed")
    return 1 if image.failures else 0


def tear_down(stack):
    if image.failures:
        for service in ("crewd-a", "crewd-b", "redis", "prometheus"):
            logs = stack.compose("logs", service, timeout=60)
            print(f"---- {service} log ----\n{logs.stdout[-3000:]}{logs.stderr[-2000:]}")
    t = time.monotonic()
    down = stack.compose("down", timeout=300)
    down_s = time.monotonic() - t
    check(down.returncode == 0, f"scripts/compose.sh down exits 0 {down.stderr.strip()}")
    left = stack.leftovers()
    check(not left, f"nothing of project {stack.project} is left after down {left}")
    print(f"figure: down in {down_s:.1f} s", flush=True)


def run_checks(repo, stack, port_a, port_b, port_prom):
    t_up = time.monotonic()
    up = stack.compose("up", timeout=UP_TIMEOUT_S)
    up_s = time.monotonic() - t_up
    # image.sh prints a line for each image it rebuilt, nothing otherwise.
    rebuilt = [line for line in up.stdout.splitlines() if line.startswith("image.sh:")]
    if not check(up.returncode == 0, f"scripts/compose.sh up exits 0 ({up_s:.1f} s)"):
        print(up.stdout[-3000:] + up.stderr[-3000:])
        return
    for line in rebuilt:
        print(line)
    for port in (port_a, port_b):
        status, body = image.http("GET", f"http://127.0.0.1:{port}/readyz")
        check(status == 200, f"crewd on :{port} is ready (Redis reached) after up: {status} "
              f"{body.strip()}")

    enqueue = stack.crewctl("enqueue", "--kind", "sleep", "--ms", str(JOB_MS), "--count", str(JOBS))
    ids = set(enqueue.stdout.split())
    check(len(ids) == JOBS, f"crewctl enqueue through crewd-a's container added {len(ids)} "
          f"of {JOBS} jobs")

    def first_done():
        return any(r.get("status") == "ok" for rs in results(stack).values() for r in rs)

    if check(image.wait_for(first_done, 60, interval=0.1), "a first job is done within 60 s"):
        first_s = time.monotonic() - t_up
        print(f"figure: up -> first job done in {first_s:.1f} s "
              f"({'images rebuilt' if rebuilt else 'image cache warm'})", flush=True)
        if not rebuilt:
            check(first_s < WARM_UP_TO_FIRST_JOB_S,
                  f"with no image rebuilt, up -> first job done within "
                  f"{WARM_UP_TO_FIRST_JOB_S} s ({first_s:.1f} s)")

    def all_done():
        by_job = results(stack)
        done = {j for j in ids if any(r.get("status") == "ok" for r in by_job.get(j, []))}
        return by_job if done == ids else None

    by_job = image.wait_for(all_done, 60, interval=0.2)
    if check(by_job is not None, f"every one of the {JOBS} jobs has a result with status ok "
             "within 60 s"):
        ran_on = {}
        for j in ids:
            for r in by_job[j]:
                ran_on[r.get("instance")] = ran_on.get(r.get("instance"), 0) + 1
        check(set(ran_on) == INSTANCES, f"the jobs ran on both instances: {ran_on}")
    for name, port in (("crewd-a", port_a), ("crewd-b", port_b)):
        _, metrics = image.http("GET", f"http://127.0.0.1:{port}/metrics")
        n = image.gauge(metrics, "crewd_redis_jobs_total", {"outcome": "succeeded"})
        check(n is not None and n > 0,
              f"{name}'s crewd_redis_jobs_total{{outcome=\"succeeded\"}} is {n}")

    prom = f"http://127.0.0.1:{port_prom}"

    def targets_up():
        data = prometheus_get(prom, "/api/v1/targets") or {}
        up = {t["labels"].get("instance") for t in data.get("activeTargets", [])
              if t["labels"].get("job") == "crewd" and t.get("health") == "up"}
        return up if up == {i + ":8080" for i in INSTANCES} else None

    check(image.wait_for(targets_up, 30, interval=0.5),
          "Prometheus has both crewd targets (job crewd) up within 30 s")

    def scraped_jobs():
        data = prometheus_get(prom, "/api/v1/query", query='sum by (instance) '
                              '(crewd_redis_jobs_total{job="crewd",outcome="succeeded"})') or {}
        got = {r["metric"].get("instance"): float(r["value"][1]) for r in data.get("result", [])}
        return got if len(got) == 2 and all(v > 0 for v in got.values()) else None

    got = image.wait_for(scraped_jobs, 30, interval=0.5)
    check(got is not None, f"Prometheus' scrapes show jobs done on both instances: {got}")

    prom_id = stack.container("prometheus")
    out = stack.engine.run("exec", prom_id, "promtool", "check", "config",
                           "/etc/prometheus/prometheus.yml", timeout=60, check_rc=False)
    check(out.returncode == 0, "promtool check config accepts the configuration and its rule "
          f"files: {(out.stdout + out.stderr).strip()}")
    files = {os.path.basename(f) for f in
             glob.glob(os.path.join(repo, "deploy", "monitoring", "rules", "*.yml"))}
    groups = (prometheus_get(prom, "/api/v1/rules") or {}).get("groups", [])
    loaded = {os.path.basename(g.get("file", "")) for g in groups}
    check(loaded == files, f"Prometheus loaded a rule group from each of "
          f"deploy/monitoring/rules/*.yml: {sorted(files)}; loaded {sorted(loaded)} "
          f"({len(groups)} groups)")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks deploy/k8s against crewd itself, so that the two cannot drift apart.

Renders the kustomization with `kubectl kustomize`, then runs the crewd
binary the way the Deployment does (its args, its CREWD_* env, the mounted
ConfigMap as the config file) with --print-config, and checks:
  - the listen port is the container port the probes and the Service use,
    on an address reachable from outside the pod;
  - the liveness and readiness probe paths are /healthz and /readyz, and a
    crewd started with that configuration answers 200 on both;
  - terminationGracePeriodSeconds exceeds the preStop sleep plus crewd's
    shutdown.termination_timeout_ms, so the kubelet never kills a graceful stop;
  - resource requests and limits are set, requests <= limits;
  - the Service and the HorizontalPodAutoscaler point at the Deployment.

  crewd_deploy_test.py --crewd BUILD/service/crewd --manifests deploy/k8s

Exit 0: all checks pass; 1: a check failed; 77: kubectl is not installed
(Debian package kubernetes-client; scripts/deps.sh test installs it).
Every subprocess and request is bounded by a timeout.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request

import yaml

SKIP = 77
failures = []


def check(ok, message):
    print(("ok    " if ok else "FAIL  ") + message)
    if not ok:
        failures.append(message)
    return ok


def render(kubectl, manifests):
    out = subprocess.run([kubectl, "kustomize", manifests], capture_output=True, text=True,
                         timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    if not check(len(found) == 1, f"exactly one {kind} (found {len(found)})"):
        sys.exit(1)
    return found[0]


def quantity(q):
    """A CPU or memory quantity as a number (cores, bytes)."""
    q = str(q)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", q)
    if not m or (m.group(2) and m.group(2) not in units):
        raise ValueError(f"unreadable quantity {q!r}")
    return float(m.group(1)) * (units[m.group(2)] if m.group(2) else 1)


def crewd_command(crewd, container, pod_spec, configmaps, workdir):
    """crewd's command line and environment as the container runs them."""
    args = list(container.get("args", []))
    # The config file lives on a ConfigMap volume: write it out here.
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            path = args[i + 1]
            directory, name = os.path.split(path)
            volume = volumes.get(mounts.get(directory, ""), {})
            cm_name = volume.get("configMap", {}).get("name")
            data = configmaps.get(cm_name, {}).get("data", {})
            if not check(name in data, f"--config {path} is a key of ConfigMap {cm_name}"):
                sys.exit(1)
            local = os.path.join(workdir, name)
            with open(local, "w") as f:
                f.write(data[name])
            args[i + 1] = local
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWD_")}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return [crewd] + args, env


def effective_config(command, env):
    out = subprocess.run(command + ["--print-config"], capture_output=True, text=True, env=env,
                         timeout=30)
    if not check(out.returncode == 0, f"crewd --print-config exits 0 ({out.stderr.strip()})"):
        sys.exit(1)
    return tomllib.loads(out.stdout)


def probe_paths_answer(command, env, paths):
    """Starts crewd with the pod's configuration on a free loopback port and
    GETs each path; returns {path: status}."""
    proc = subprocess.Popen(command + ["--listen", "127.0.0.1:0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    statuses = {}
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on http://[^:]+:([0-9]+)", line)
            if m:
                port = int(m.group(1))
        if not check(port is not None, "crewd started with the pod's configuration"):
            return statuses
        for p in paths:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{p}", timeout=10) as r:
                    statuses[p] = r.status
            except urllib.error.HTTPError as e:
                statuses[p] = e.code
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return statuses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crewd", required=True)
    ap.add_argument("--manifests", required=True)
    a = ap.parse_args()

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: kubectl not found (Debian package kubernetes-client; "
              "scripts/deps.sh test installs it)")
        return SKIP
    docs = render(kubectl, a.manifests)
    print(f"rendered {len(docs)} objects: " + ", ".join(d["kind"] for d in docs))

    deployment = one(docs, "Deployment")
    service = one(docs, "Service")
    hpa = one(docs, "HorizontalPodAutoscaler")
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    containers = [c for c in spec["containers"] if c["name"] == "crewd"]
    if not check(len(containers) == 1, "the pod has a container named crewd"):
        return 1
    c = containers[0]

    with tempfile.TemporaryDirectory() as workdir:
        command, env = crewd_command(a.crewd, c, spec, configmaps, workdir)
        config = effective_config(command, env)
        host, _, port = config["listen"].rpartition(":")
        port = int(port)
        shutdown = config["shutdown"]
        print(f"crewd in the pod: listen {config['listen']}, shutdown.termination_timeout_ms "
              f"{shutdown['termination_timeout_ms']}, shutdown.timeout_ms {shutdown['timeout_ms']}")

        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        check(port in ports.values(), f"crewd's port {port} is a container port {ports}")
        check(host not in ("127.0.0.1", "localhost", "::1"),
              f"crewd listens on {host}, reachable from outside the pod")

        def resolve(p):
            return ports.get(p) if isinstance(p, str) else p

        wanted = {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
        for probe, path in wanted.items():
            get = c.get(probe, {}).get("httpGet")
            if not check(get is not None, f"{probe} is an httpGet probe"):
                continue
            check(get.get("path") == path, f"{probe} path {get.get('path')} == {path}")
            check(resolve(get.get("port")) == port,
                  f"{probe} port {get.get('port')} is crewd's port {port}")
        statuses = probe_paths_answer(command, env, list(wanted.values()))
        for path in wanted.values():
            check(statuses.get(path) == 200, f"crewd answers GET {path} with 200 "
                  f"(got {statuses.get(path)})")

    pre_stop = c.get("lifecycle", {}).get("preStop")
    check(pre_stop is not None, "the container has a preStop hook")
    pre_stop_s = 0
    cmd = (pre_stop or {}).get("exec", {}).get("command", [])
    if len(cmd) == 2 and cmd[0] == "sleep":
        pre_stop_s = float(cmd[1])
    elif (pre_stop or {}).get("sleep"):
        pre_stop_s = float(pre_stop["sleep"]["seconds"])
    grace = spec.get("terminationGracePeriodSeconds", 30)
    needed = pre_stop_s + shutdown["termination_timeout_ms"] / 1000
    check(grace > needed, f"terminationGracePeriodSeconds {grace} > preStop {pre_stop_s:g} s + "
          f"shutdown.termination_timeout_ms {shutdown['termination_timeout_ms']} ms")
    check(shutdown["timeout_ms"] < shutdown["termination_timeout_ms"],
          "the pools' shutdown timeout is below the termination timeout")

    res = c.get("resources", {})
    for kind in ("cpu", "memory"):
        req = res.get("requests", {}).get(kind)
        lim = res.get("limits", {}).get(kind)
        if check(req is not None and lim is not None, f"{kind} request and limit are set"):
            check(quantity(req) <= quantity(lim), f"{kind} request {req} <= limit {lim}")

    labels = pod["metadata"].get("labels", {})
    selector = service["spec"].get("selector", {})
    check(selector and all(labels.get(k) == v for k, v in selector.items()),
          f"the Service selects the pod ({selector})")
    for p in service["spec"]["ports"]:
        check(resolve(p.get("targetPort", p["port"])) == port,
              f"Service port {p['port']} targets crewd's port {port}")
    ref = hpa["spec"]["scaleTargetRef"]
    check(ref["kind"] == "Deployment" and ref["name"] == deployment["metadata"]["name"],
          f"the HPA scales Deployment {deployment['metadata']['name']}")
    check(1 <= hpa["spec"].get("minReplicas", 1) <= hpa["spec"]["maxReplicas"],
          "HPA minReplicas <= maxReplicas")

    print(f"{len(failures)} checks failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

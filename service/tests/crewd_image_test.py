#!/usr/bin/env python3
"""Builds crewd's container image and runs it the way deploy/k8s runs the pod.

Renders the kustomization with `kubectl kustomize` (as crewd_deploy_test.py
does) and takes from it the image name, the container port, the probe paths,
the user id, the security context, the args, env and ConfigMap, and the
termination grace period. Then:
  - builds the image with scripts/image.sh (docker or podman, layer cache);
  - checks that the image declares the manifests' non-root user id and port;
  - starts it with a read-only root filesystem, all capabilities dropped, no
    privilege escalation, the ConfigMap mounted read-only, the pod's args and
    env, the container port published on a free loopback port; the process
    must run as the manifests' user id;
  - times `run` to the readiness probe's 200, then checks the liveness and
    readiness paths, GET /api/v1/factorial/20, POST /api/v1/jobs (a 50 ms
    sleep) and /metrics (`promtool check metrics` reports nothing);
  - starts a sleep job of a few seconds, waits until the jobs pool shows it
    suspended (GET /api/v1/pools),
    stops the container with the engine's stop and the manifests' grace
    period, and requires exit code 0 within the grace period and a 200 with
    outcome succeeded for the job in flight.

  crewd_image_test.py --repo REPO_ROOT [--manifests deploy/k8s]

Exit 0: all checks pass; 1: a check failed; 77: skipped, with the reason
printed (no container engine installed or able to run, or no kubectl). With
CI set (as .ci/run sets it), no container engine is a failure, not a skip.
Every subprocess, request and wait is bounded; the container is removed at
the end, whatever happened.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crewd_deploy_test as deploy  # noqa: E402  (render, one)

SKIP = 77
BUILD_TIMEOUT_S = 2400  # a cold build: base image, packages, crewd
IN_FLIGHT_JOB_MS = 3000
failures = []


def check(ok, message):
    print(("ok    " if ok else "FAIL  ") + message, flush=True)
    if not ok:
        failures.append(message)
    return ok


class Engine:
    """scripts/container.sh: docker with a daemon, else podman with runc."""

    def __init__(self, repo):
        self.script = os.path.join(repo, "scripts", "container.sh")

    def run(self, *args, timeout=60, check_rc=True):
        out = subprocess.run(["bash", self.script, *args], capture_output=True, text=True,
                             timeout=timeout)
        if check_rc and out.returncode != 0:
            raise RuntimeError(f"container.sh {' '.join(args)}: exit {out.returncode}: "
                               f"{out.stderr.strip()}")
        return out

    def inspect(self, what, target, template):
        """`image|container inspect --format template target`, stripped."""
        return self.run(what, "inspect", "--format", template, target).stdout.strip()


def http(method, url, body=None, timeout=10):
    """(status, body text); HTTP errors are statuses, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def field(body, key):
    """body[key] of a JSON object body, or None when it is not one."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value.get(key) if isinstance(value, dict) else None


def wait_for(predicate, timeout, interval=0.02):
    """Polls predicate until it returns a true value or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def gauge(metrics_text, name, labels):
    """The value of the sample `name` whose labels include `labels`, or None."""
    for line in metrics_text.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def pod_from_manifests(manifests):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    docs = deploy.render(kubectl, manifests)
    deployment = deploy.one(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    c = [c for c in spec["containers"] if c["name"] == "crewd"][0]
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if not check(len(ports) == 1, f"the container has one port {ports}"):
        sys.exit(1)
    port = next(iter(ports.values()))

    def probe_path(probe):
        get = c.get(probe, {}).get("httpGet", {})
        p = get.get("port")
        check((ports.get(p) if isinstance(p, str) else p) == port,
              f"{probe} is on the container port {port}")
        return get.get("path")

    sc_pod = spec.get("securityContext", {})
    sc = {**sc_pod, **c.get("securityContext", {})}  # the container's wins, as in Kubernetes
    # ConfigMap volumes: mount path -> {file: content}.
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {}
    for m in c.get("volumeMounts", []):
        cm = volumes.get(m["name"], {}).get("configMap", {}).get("name")
        if check(cm in configmaps, f"volume {m['name']} is a rendered ConfigMap ({cm})"):
            mounts[m["mountPath"]] = configmaps[cm].get("data", {})
    return {
        "image": c["image"],
        "port": port,
        "liveness": probe_path("livenessProbe"),
        "readiness": probe_path("readinessProbe"),
        "run_as_user": sc.get("runAsUser"),
        "run_as_non_root": sc.get("runAsNonRoot", False),
        "read_only": sc.get("readOnlyRootFilesystem", False),
        "drop_all": "ALL" in sc.get("capabilities", {}).get("drop", []),
        "no_new_privileges": sc.get("allowPrivilegeEscalation") is False,
        "args": [str(a) for a in c.get("args", [])],
        "env": {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e},
        "mounts": mounts,
        "grace_s": int(spec.get("terminationGracePeriodSeconds", 30)),
    }


def engine_usable(engine):
    """None when the engine can run containers here, else why not."""
    which = engine.run("--which", check_rc=False)
    if which.returncode != 0:
        return (f"no container engine: {which.stderr.strip()}; `make image` "
                "(scripts/deps.sh image) installs podman")
    info = engine.run("info", check_rc=False, timeout=60)
    if info.returncode != 0:
        return f"{which.stdout.strip()} cannot run here: {info.stderr.strip()[-300:]}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--manifests")
    a = ap.parse_args()
    manifests = a.manifests or os.path.join(a.repo, "deploy", "k8s")
    engine = Engine(a.repo)

    why = engine_usable(engine)
    if why and os.environ.get("CI", "false") not in ("", "false", "0"):
        # .ci/run runs `make image` first: there, no engine is a failure.
        check(False, f"CI={os.environ['CI']}: a container engine runs ({why})")
        return 1
    if why:
        print(f"SKIP: {why}")
        return SKIP
    pod = pod_from_manifests(manifests)
    if pod is None:
        print("SKIP: kubectl not found (Debian package kubernetes-client; "
              "scripts/deps.sh test installs it)")
        return SKIP
    print(f"engine {engine.run('--which').stdout.strip()}; from the manifests: "
          + json.dumps({k: v for k, v in pod.items() if k != "mounts"}), flush=True)

    # The image, built from the current sources (a no-op when nothing changed).
    t = time.monotonic()
    built = subprocess.run(["bash", os.path.join(a.repo, "scripts", "image.sh"), pod["image"]],
                           cwd=a.repo, timeout=BUILD_TIMEOUT_S)
    if not check(built.returncode == 0, f"scripts/image.sh {pod['image']} builds the image "
                 f"({time.monotonic() - t:.1f} s)"):
        return 1

    user = engine.inspect("image", pod["image"], "{{.Config.User}}")
    uid = user.split(":")[0]
    check(uid.isdigit() and int(uid) == pod["run_as_user"],
          f"the image's USER {user!r} is the manifests' runAsUser {pod['run_as_user']}")
    check(pod["run_as_non_root"] and uid.isdigit() and int(uid) != 0,
          "the manifests require a non-root user and the image declares one")
    exposed = engine.inspect("image", pod["image"], "{{json .Config.ExposedPorts}}")
    check(f"{pod['port']}/tcp" in exposed, f"the image exposes {pod['port']}/tcp ({exposed})")

    check(pod["read_only"] and pod["drop_all"] and pod["no_new_privileges"],
          "the manifests run crewd with a read-only root filesystem, no capabilities and no "
          "privilege escalation (and so does this test)")

    name = f"crewd-image-test-{os.getpid()}"
    with tempfile.TemporaryDirectory() as work:
        cmd = ["run", "-d", "--name", name, "-p", f"127.0.0.1::{pod['port']}"]
        if pod["read_only"]:
            cmd.append("--read-only")
        if pod["drop_all"]:
            cmd += ["--cap-drop", "ALL"]
        if pod["no_new_privileges"]:
            cmd += ["--security-opt", "no-new-privileges"]
        for k, v in pod["env"].items():
            cmd += ["-e", f"{k}={v}"]
        for i, (path, files) in enumerate(pod["mounts"].items()):
            d = os.path.join(work, f"volume{i}")
            os.mkdir(d)
            for fname, content in files.items():
                with open(os.path.join(d, fname), "w") as f:
                    f.write(content)
                os.chmod(os.path.join(d, fname), 0o644)
            os.chmod(d, 0o755)
            os.chmod(work, 0o755)
            cmd += ["-v", f"{d}:{path}:ro"]
        cmd += [pod["image"], *pod["args"]]
        try:
            return run_checks(engine, pod, name, cmd)
        finally:
            if failures:
                logs = engine.run("logs", name, check_rc=False, timeout=30)
                print("---- container log ----\n" + logs.stdout + logs.stderr + "----")
            engine.run("rm", "-f", name, check_rc=False, timeout=120)


def run_checks(engine, pod, name, cmd):
    t_run = time.monotonic()
    engine.run(*cmd, timeout=120)
    hostport = engine.run("port", name, f"{pod['port']}/tcp", timeout=30).stdout.split()[0]
    base = f"http://{hostport}"

    def ready():
        try:
            return http("GET", base + pod["readiness"], timeout=2)[0] == 200
        except OSError:
            return False

    if not check(wait_for(ready, 60), f"{pod['readiness']} answers 200 within 60 s of `run`"):
        return 1
    print(f"figure: run -> {pod['readiness']} 200 in {time.monotonic() - t_run:.2f} s", flush=True)

    pid = engine.inspect("container", name, "{{.State.Pid}}")
    try:
        with open(f"/proc/{pid}/status") as f:
            uids = re.search(r"^Uid:\s+(\d+)", f.read(), re.M).group(1)
        check(int(uids) == pod["run_as_user"],
              f"crewd runs as uid {uids}, the manifests' runAsUser {pod['run_as_user']}")
    except OSError as e:  # an engine in a VM: its processes are not ours to see
        print(f"note: uid of the container's process not checked: {e}")
    check(engine.inspect("container", name, "{{.HostConfig.ReadonlyRootfs}}") == str(pod["read_only"])
          .lower(), f"the container's root filesystem is read-only: {pod['read_only']}")

    for path in (pod["liveness"], pod["readiness"]):
        status, body = http("GET", base + path)
        check(status == 200, f"GET {path} -> {status} {body.strip()}")
    status, body = http("GET", base + "/api/v1/factorial/20")
    check(status == 200 and field(body, "result") == math.factorial(20),
          f"GET /api/v1/factorial/20 -> {status} {body.strip()}")
    status, body = http("POST", base + "/api/v1/jobs", {"kind": "sleep", "ms": 50})
    check(status == 200 and field(body, "outcome") == "succeeded",
          f"POST /api/v1/jobs sleep 50 ms -> {status} {body.strip()}")
    status, metrics = http("GET", base + "/metrics")
    check(status == 200 and "crew_workers" in metrics, f"GET /metrics -> {status}, crew_workers")
    promtool = shutil.which("promtool")
    if check(promtool is not None, "promtool is installed (Debian package prometheus)"):
        out = subprocess.run([promtool, "check", "metrics"], input=metrics, capture_output=True,
                             text=True, timeout=30)
        check(out.returncode == 0 and not (out.stdout + out.stderr).strip(),
              f"promtool check metrics reports nothing ({(out.stdout + out.stderr).strip()})")

    # The stop, with a job in flight.
    result = {}

    def in_flight_job():
        try:
            result["r"] = http("POST", base + "/api/v1/jobs",
                               {"kind": "sleep", "ms": IN_FLIGHT_JOB_MS},
                               timeout=pod["grace_s"] + 30)
        except OSError as e:
            result["r"] = (None, repr(e))

    job = threading.Thread(target=in_flight_job, daemon=True)
    t_job = time.monotonic()
    job.start()

    def job_running():
        # A sleep job is a coroutine task: waiting, it is suspended, on no worker.
        try:
            status, body = http("GET", base + "/api/v1/pools", timeout=2)
            pools = json.loads(body)["pools"] if status == 200 else []
        except (OSError, ValueError):
            return False
        return any(p["name"] == "jobs" and p.get("suspended", 0) >= 1 for p in pools)

    check(wait_for(job_running, 10), "the sleep job waits in the jobs pool before the stop")
    t_stop = time.monotonic()
    stop = engine.run("stop", "-t", str(pod["grace_s"]), name, timeout=pod["grace_s"] + 60,
                      check_rc=False)
    stopped_s = time.monotonic() - t_stop
    check(stop.returncode == 0, f"stop -t {pod['grace_s']} returns 0 {stop.stderr.strip()}")
    running = engine.inspect("container", name, "{{.State.Running}}")
    code = engine.inspect("container", name, "{{.State.ExitCode}}")
    check(running == "false" and code == "0", f"crewd exited with code {code} (running {running})")
    check(stopped_s < pod["grace_s"],
          f"stop -> exit in {stopped_s:.2f} s, within the grace period {pod['grace_s']} s")
    print(f"figure: stop -> exit with a {IN_FLIGHT_JOB_MS} ms job in flight: {stopped_s:.2f} s "
          f"(the job sent {t_stop - t_job:.2f} s before the stop)", flush=True)
    job.join(timeout=30)
    status, body = result.get("r", (None, "no answer"))
    check(status == 200 and field(body, "outcome") == "succeeded",
          f"the job in flight during the stop -> {status} {body.strip()}")

    print(f"{len(failures)} checks failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

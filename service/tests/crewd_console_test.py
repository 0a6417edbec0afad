#!/usr/bin/env python3
"""The operations console (GET /ui) in a real browser: Debian's chromium,
headless, driven through chromedriver by python3-selenium, against crewd
processes this script starts on free ports.

  crewd_console_test.py --crewd BUILD/service/crewd [--case NAME] [--shots DIR]

Cases (--case runs one; ctest registers each as its own test):
  page       the page loads with no console error and no request to another
             origin, weighs under 100 KB, and fits a 360-pixel-wide viewport
             without horizontal scrolling; takes the screenshots (--shots)
  busy       8 jobs holding a worker each (kind "stuck"): the page's busy
             count equals /api/v1/pools within 1.5 s
  overdue    a job with a 1 s deadline that ignores its stop (kind "stuck",
             jobs.allow_stuck): "overdue" within 2 s of its deadline, then
             "abandoned" with the replacement worker within 2 s of the
             write-off
  cancel     Cancel then Confirm ends a running job "cancelled" and its row
             updates within 1 s; the same POST from another origin gets 403
             and the job keeps running
  readonly   ui.read_only: no Cancel button, and a direct POST gets 403
  hostile    a job named <img src=x onerror=...> shows as those characters and
             no dialog opens (crewd's job names are restricted to
             [A-Za-z0-9._:-], so a proxy in front of crewd serves its real page
             and rewrites the names in its snapshots)
  shutdown   SIGTERM shows the shutdown banner within 1 s, and the counts shown
             match the report crewd logs on exit
  stale      stopping crewd shows the stale banner within 3 s; restarting it
             clears the banner
  hidden     no snapshot is requested while the page's tab is hidden; polling
             resumes when it is visible again
  redis      with [redis] configured (against a redis-server it starts): the
             connection, and a dead letter with its error
  queued     with 10,000 queued jobs (behind a stuck one) the snapshot is under 64 KB, is
             built in under 5 ms (release builds only), and the page says how many rows it
             left out
  request_id a job sent with X-Request-Id <b>req-1</b>"'& shows that id as
             text in the running tasks, then in the recent outcomes

Exit 0: all pass; 1: a check failed; 77: no chromium, chromedriver or
selenium (scripts/deps.sh test installs them), unless CI is set, when that
is a failure. Every wait is bounded.
"""
import argparse
import http.server
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

SKIP = 77
failures = []
# Loaded machines run these slower; the product's own bounds (1 s, 1.5 s,
# 2 s, 3 s) are not scaled.
POLL = 0.05
# Bounds and timed figures are multiplied by this in sanitizer builds
# (--slowdown, set by CMake), where crewd runs several times slower: there
# the cases check what the page shows, the release build its timing.
SLOWDOWN = 1.0


def check(ok, message):
    print(("ok    " if ok else "FAIL  ") + message, flush=True)
    if not ok:
        failures.append(message)
    return ok


def wait_until(pred, timeout, step=POLL):
    """Polls pred() until it returns a true value or `timeout` seconds pass."""
    end = time.monotonic() + timeout * SLOWDOWN
    while True:
        v = pred()
        if v or time.monotonic() >= end:
            return v
        time.sleep(step)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Crewd:
    """crewd as a child process; its log (stderr) collected by a thread."""

    def __init__(self, binary, *args, port=0):
        self.lines = []
        self.proc = subprocess.Popen(
            [binary, "--listen", f"127.0.0.1:{port}", "--ui-enabled", "true", "--jobs-max-ms",
             "600000", "--jobs-max-timeout-ms", "600000", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        line = self.wait_log(r"listening on http://127\.0\.0\.1:(\d+)", 10)
        if not line:
            self.kill()
            raise RuntimeError("crewd did not start:\n" + self.log())
        self.port = int(re.search(r":(\d+)\s*$", line.strip()).group(1))
        self.origin = f"http://127.0.0.1:{self.port}"
        if not self.wait_log(r"\bready: ", 10):
            self.kill()
            raise RuntimeError("crewd did not get ready:\n" + self.log())

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def log(self):
        return "".join(self.lines)

    def wait_log(self, pattern, timeout):
        rx = re.compile(pattern)
        return wait_until(lambda: next((l for l in list(self.lines) if rx.search(l)), None),
                          timeout)

    def get_json(self, path, headers=None):
        req = urllib.request.Request(self.origin + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def post(self, path, body=b"", headers=None):
        req = urllib.request.Request(self.origin + path, data=body, method="POST",
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def submit(self, request_id=None, **job):
        """Sends POST /api/v1/jobs on a connection of its own and returns the
        socket without waiting: crewd answers when the job ends."""
        body = json.dumps(job).encode()
        extra = f"X-Request-Id: {request_id}\r\n".encode() if request_id else b""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                  extra + b"Content-Type: application/json\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        return s

    def jobs_pool(self):
        return next(p for p in self.get_json("/api/v1/pools")["pools"] if p["name"] == "jobs")

    def stop(self, sig=signal.SIGTERM, timeout=25):
        """Sends `sig` (None: none, crewd is stopping already) and waits."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.reader.join(timeout=5)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def read_response(sock, timeout=10):
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode(errors="replace")


# ---- The browser ----

def browser(width=1280, height=900):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-extensions", "--no-first-run", "--hide-scrollbars",
              "--disable-background-networking", "--disable-component-update",
              "--disable-default-apps", "--disable-sync", "--metrics-recording-only",
              f"--window-size={width},{height}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    service = Service(executable_path=shutil.which("chromedriver"))
    d = webdriver.Chrome(service=service, options=opts)
    d.set_page_load_timeout(20)
    d.set_script_timeout(10)
    return d


def attr(d, selector, name):
    return d.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null;",
        selector, name)


def visible(d, selector):
    return d.execute_script(
        "const e = document.querySelector(arguments[0]); return !!e && !e.hidden;", selector)


def row_state(d, task_id):
    return d.execute_script(
        "const e = document.querySelector('[data-running] tr[data-task-id=\"' + arguments[0] + '\"]');"
        "return e ? e.dataset.state : null;", str(task_id))


def click(d, selector):
    """Clicks in one step: the page re-renders its rows every poll, so an
    element found in one call may be gone by the next."""
    return d.execute_script(
        "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e;", selector)


def open_console(d, crewd, suffix=""):
    d.get(crewd.origin + "/ui" + suffix)
    return wait_until(lambda: d.execute_script(
        "return document.querySelector('[data-pool=jobs]') !== null"), 5)


def running_job_id(crewd, name, timeout=5):
    """On a worker, or (a sleep job waiting) among the suspended coroutine tasks."""
    def find():
        for p in crewd.get_json("/api/v1/pools")["pools"]:
            for w in p["worker_list"] + p["suspended_list"]:
                if w.get("task", {}).get("name") == name:
                    return w["task"]["id"]
        return None
    return wait_until(find, timeout)


class Session:
    """A crewd (started with `args`) and a browser for one case. Leaving it
    quits the browser, closes what the case registered in `closers` (the
    job connections of submit(), helper servers), and kills crewd."""

    def __init__(self, binary, *args, port=0):
        # The cases are about what the page shows, and stand jobs queued on
        # purpose: crewd's overload controller (on by default) would shed
        # them or refuse them, more so in a sanitizer build, where workers
        # start slowly. Its 503s have tests of their own (crewd_http_test).
        self.crewd = Crewd(binary, "--jobs-overload", "false", *args, port=port)
        self.closers = []
        try:
            self.d = browser()
        except Exception:
            self.crewd.kill()
            raise

    def submit(self, request_id=None, **job):
        sock = self.crewd.submit(request_id, **job)
        self.closers.append(sock.close)
        return sock

    def run_job(self, name, **job):
        """Submits job `name` and returns its task id once a worker runs it
        (None if none does within 5 s), and its connection."""
        sock = self.submit(name=name, **job)
        return running_job_id(self.crewd, name), sock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.d.quit()
        for close in reversed(self.closers):
            close()
        self.crewd.kill()


# ---- The cases ----

def case_page(binary, shots):
    with Session(binary, "--jobs-workers", "3", "--jobs-queue-timeout-ms", "60000") as s:
        crewd, d = s.crewd, s.d
        for i in range(3):
            s.submit(kind="sleep", ms=20000, timeout_ms=30000, name=f"report-{i}")
        for i in range(2):
            s.submit(kind="sleep", ms=20000, timeout_ms=30000, name=f"waiting-{i}")
        d.get_log("browser")
        # crewd's own view first, so that a failure says which side lacks
        # them (any three of the five run first: they arrive on five
        # connections at once).
        def jobs_pool():
            return [p for p in crewd.get_json("/api/v1/pools")["pools"]
                    if p["name"] == "jobs"][0]
        # (Sleep jobs are coroutine tasks: running, they wait suspended.)
        if not check(wait_until(lambda: len(jobs_pool()["suspended_list"]) >= 3, 5),
                     "crewd runs 3 jobs"):
            print("      pool jobs:", json.dumps(jobs_pool())[:2000], flush=True)
        check(open_console(d, crewd), "the console renders its pools")
        shown = lambda: d.execute_script(
            "return document.querySelectorAll('[data-running] tr').length")
        if not check(wait_until(lambda: shown() >= 3, 3),
                     "the running jobs show"):
            print(f"      {shown()} rows; snapshot:",
                  json.dumps(crewd.get_json("/api/v1/ui/snapshot").get("running"))[:2000],
                  flush=True)
        time.sleep(3)  # a few seconds of series
        with urllib.request.urlopen(crewd.origin + "/ui", timeout=5) as r:
            size = len(r.read())
            csp = r.headers.get("Content-Security-Policy", "")
        check(size < 100 * 1024, f"the page weighs {size} bytes (< 100 KB)")
        check("default-src 'none'" in csp and "'unsafe-inline'" not in csp,
              "a strict Content-Security-Policy: " + csp[:80] + "...")
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        check(not errors, f"0 console errors ({errors[:3]})")
        urls = set()
        for entry in d.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                urls.add(msg["params"]["request"]["url"])
        foreign = [u for u in urls if not (u.startswith(crewd.origin + "/") or u.startswith("data:"))]
        check(urls and not foreign, f"0 requests to another origin ({len(urls)} URLs; {foreign[:3]})")
        if shots:
            os.makedirs(shots, exist_ok=True)
            d.save_screenshot(os.path.join(shots, "console-desktop.png"))
        d.set_window_size(360, 800)
        d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                          {"width": 360, "height": 800, "deviceScaleFactor": 1, "mobile": True})
        time.sleep(1)
        widths = d.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth,"
            " window.innerWidth];")
        check(widths[0] <= 360 and widths[0] <= widths[1],
              f"fits 360 px without horizontal scrolling (scrollWidth {widths[0]}, "
              f"clientWidth {widths[1]}, innerWidth {widths[2]})")
        if shots:
            d.save_screenshot(os.path.join(shots, "console-360.png"))


def case_busy(binary, _shots):
    # Stuck jobs hold a worker while they run (a sleep job waits on none).
    with Session(binary, "--jobs-workers", "16", "--jobs-allow-stuck", "true") as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        for i in range(8):
            s.submit(kind="stuck", ms=15000, timeout_ms=20000, name=f"stuck-{i}")
        seen = wait_until(lambda: crewd.jobs_pool()["busy"] == 8, 5)
        t0 = time.monotonic()
        check(seen, "/api/v1/pools says 8 busy")
        page = wait_until(lambda: attr(d, "[data-pool=jobs] [data-busy]", "data-busy") == "8", 3)
        took = time.monotonic() - t0
        check(page and took <= 1.5 * SLOWDOWN, f"the page shows busy 8 within 1.5 s (took {took:.2f} s)")


def case_overdue(binary, _shots):
    with Session(binary, "--jobs-allow-stuck", "true") as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        task, sock = s.run_job("stuck-job", kind="stuck", ms=8000, timeout_ms=1000)
        started = time.monotonic()  # within a poll of the task's start
        check(task, "the stuck job runs")
        seen = wait_until(lambda: row_state(d, task) == "overdue", 4)
        t = time.monotonic() - started
        check(seen and t <= (1 + 2) * SLOWDOWN, f"'overdue' within 2 s of the 1 s deadline (at {t:.2f} s)")
        # The write-off: crewd logs it when the abandon grace (1 s) ends.
        line = crewd.wait_log(r"task abandoned", 5)
        written_off = time.monotonic()
        check(line, "crewd wrote the worker off")
        seen = wait_until(lambda: row_state(d, task) == "abandoned" and
                          attr(d, f"[data-running] tr[data-task-id='{task}']", "data-replacement"), 3)
        t = time.monotonic() - written_off
        worker = attr(d, f"[data-running] tr[data-task-id='{task}']", "data-worker")
        repl = attr(d, f"[data-running] tr[data-task-id='{task}']", "data-replacement")
        check(seen and t <= 2 * SLOWDOWN, f"'abandoned' with its replacement within 2 s of the write-off "
              f"(at {t:.2f} s; worker {worker}, replaced by {repl})")
        check(repl and repl != worker, "the replacement is another worker")
        text = d.execute_script(
            "return document.querySelector(\"[data-running] tr[data-task-id='\" + arguments[0] + \"']\").textContent",
            str(task))
        check(f"replaced by worker {repl}" in text, f"the row names the replacement ({text!r})")
        sock.close()


class Server:
    """A small HTTP server on 127.0.0.1 (a free port) for pages and proxies the
    cases need: `answer(path)` returns (status, headers, body) for a GET."""

    def __init__(self, answer):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                status, headers, body = answer(self.path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def other_origin():
    """A page on another origin (http://localhost:PORT, another site than
    127.0.0.1) for cross-origin requests."""
    return Server(lambda _path: (200, {"Content-Type": "text/html"},
                                 b"<!doctype html><title>elsewhere</title><p>elsewhere</p>"))


def metric(crewd, pattern):
    with urllib.request.urlopen(crewd.origin + "/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(pattern + r"\s+([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


def case_cancel(binary, _shots):
    with Session(binary) as s:
        crewd, d = s.crewd, s.d
        other = other_origin()
        s.closers.append(other.close)
        check(open_console(d, crewd), "the console renders its pools")
        task, sock = s.run_job("to-cancel", kind="sleep", ms=30000, timeout_ms=60000)
        check(task, "the job runs")
        btn = f"[data-running] tr[data-task-id='{task}'] [data-cancel]"
        check(wait_until(lambda: d.execute_script(f"return !!document.querySelector(\"{btn}\")"), 3),
              "its row has a Cancel button")
        click(d, btn)
        confirm = f"[data-running] tr[data-task-id='{task}'] [data-confirm]"
        check(wait_until(lambda: d.execute_script(f"return !!document.querySelector(\"{confirm}\")"), 2),
              "Cancel asks for a confirmation")
        check(row_state(d, task) == "running", "nothing is cancelled before Confirm")
        clicked = time.monotonic()
        click(d, confirm)
        recent = f"[data-recent] tr[data-task-id='{task}']"
        done = wait_until(lambda: row_state(d, task) is None and
                          attr(d, recent, "data-outcome") == "cancelled", 2)
        t = time.monotonic() - clicked
        check(done and t <= SLOWDOWN, f"the row shows 'cancelled' within 1 s of Confirm (at {t:.2f} s)")
        answer = read_response(sock)
        check(" 503 " in answer.split("\r\n")[0] and '"outcome":"cancelled"' in answer,
              "the job's client hears 'cancelled': " + answer.split("\r\n")[0])
        sock.close()

        # The same POST from a page of another origin.
        task, sock = s.run_job("keep-running", kind="sleep", ms=30000, timeout_ms=60000)
        route = r'crewd_http_requests_total\{route="/api/v1/ui/jobs/\{id\}/cancel",status="403"\}'
        before = metric(crewd, route)
        d.get(f"http://localhost:{other.port}/")
        d.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', mode: 'no-cors', credentials: 'include'})"
            ".then(() => done('sent'), (e) => done(String(e)));",
            f"{crewd.origin}/api/v1/ui/jobs/{task}/cancel")
        check(wait_until(lambda: metric(crewd, route) == before + 1, 3),
              "the cross-origin POST got 403")
        time.sleep(1)
        check(running_job_id(crewd, "keep-running", 1) == task, "and the job keeps running")
        sock.close()


def case_readonly(binary, _shots):
    with Session(binary, "--ui-read-only", "true") as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        task, sock = s.run_job("read-only-job", kind="sleep", ms=30000, timeout_ms=60000)
        check(wait_until(lambda: row_state(d, task) == "running", 3), "the job's row shows")
        check(d.execute_script("return document.querySelectorAll('[data-cancel],[data-confirm]').length") == 0,
              "no Cancel button in read-only mode")
        check(attr(d, "body", "data-is-read-only") == "true", "the page says it is read-only")
        status, _ = crewd.post(f"/api/v1/ui/jobs/{task}/cancel",
                               headers={"Sec-Fetch-Site": "same-origin"})
        check(status == 403, f"a direct POST gets 403 (got {status})")
        check(running_job_id(crewd, "read-only-job", 1) == task, "the job keeps running")
        sock.close()


HOSTILE = "<img src=x onerror=alert(1)>"


def hostile_proxy(crewd):
    """Serves crewd's own page (with its headers) and crewd's snapshots with
    every job name (and reason) replaced by HOSTILE."""
    def answer(path):
        try:
            with urllib.request.urlopen(crewd.origin + path, timeout=5) as r:
                body, headers, status = r.read(), r.headers, r.status
        except urllib.error.HTTPError as e:
            body, headers, status = e.read(), e.headers, e.code
        if path.startswith("/api/v1/ui/snapshot") and status == 200:
            snap = json.loads(body)
            for key in ("running", "queued", "recent"):
                for row in snap[key]:
                    row["name"] = HOSTILE
                    if "reason" in row:
                        row["reason"] = HOSTILE
            body = json.dumps(snap).encode()
        keep = ("Content-Type", "Content-Security-Policy", "X-Content-Type-Options")
        return status, {k: headers.get(k) for k in keep if headers.get(k)}, body
    return Server(answer)


def case_hostile(binary, _shots):
    from selenium.common.exceptions import NoAlertPresentException
    with Session(binary, "--jobs-workers", "2") as s:
        crewd, d = s.crewd, s.d
        proxy = hostile_proxy(crewd)
        s.closers.append(proxy.close)
        for i in range(3):
            s.submit(kind="sleep", ms=30000, timeout_ms=60000, name=f"n{i}")
        s.submit(kind="sleep", ms=0, timeout_ms=1000, name="done")
        d.get(proxy.origin + "/ui?name=" + urllib.request.quote(HOSTILE))
        shown = wait_until(lambda: d.execute_script(
            "return [...document.querySelectorAll('[data-running] td, [data-queued] td')]"
            ".filter(td => td.textContent === arguments[0]).length", HOSTILE) >= 3, 5)
        check(shown, "the hostile names show as their characters")
        check(d.execute_script("return document.querySelectorAll('main img, header img').length") == 0,
              "no <img> element was made from them")
        check(d.execute_script("return document.querySelector('[data-filter-name]').value") == HOSTILE,
              "the name filter from the URL is the text itself")
        time.sleep(1)
        try:
            d.switch_to.alert
            check(False, "no dialog opens")
        except NoAlertPresentException:
            check(True, "no dialog opens")


# A request id is any 1..64 visible ASCII characters, markup included.
HOSTILE_ID = "<b>req-1</b>\"'&"


def case_request_id(binary, _shots):
    with Session(binary, "--jobs-workers", "2") as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        s.submit(kind="sleep", ms=int(2000 * SLOWDOWN), timeout_ms=int(5000 * SLOWDOWN),
                 name="traced", request_id=HOSTILE_ID)
        shows = ("return [...document.querySelectorAll(arguments[0] + ' td')]"
                 ".some(td => td.textContent === arguments[1])")
        check(wait_until(lambda: d.execute_script(shows, "[data-running]", HOSTILE_ID), 5 * SLOWDOWN),
              "the running task shows its request id as text")
        check(wait_until(lambda: d.execute_script(shows, "[data-recent]", HOSTILE_ID), 10 * SLOWDOWN),
              "the recent outcome shows its request id as text")
        check(d.execute_script("return document.querySelectorAll('main b').length") == 0,
              "no element was made from it")


REPORT = re.compile(
    r"pool (\w+) stopped \((\w+)[^)]*\): in its life succeeded (\d+), failed (\d+), cancelled (\d+), "
    r"timed out (\d+), rejected (\d+); during the stop succeeded (\d+), cancelled (\d+), "
    r"timed out (\d+), rejected (\d+)")


def case_shutdown(binary, _shots):
    # Stuck jobs: 2 hold the workers, 3 wait in the queue (sleep jobs would
    # all wait suspended, on no worker).
    with Session(binary, "--jobs-workers", "2", "--shutdown-mode", "soft",
                 "--jobs-allow-stuck", "true") as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        for i in range(2):
            s.submit(kind="stuck", ms=2500, timeout_ms=10000, name=f"run-{i}")
        for i in range(3):
            s.submit(kind="stuck", ms=2500, timeout_ms=10000, name=f"wait-{i}")
        check(wait_until(lambda: crewd.jobs_pool()["queued"] == 3, 5), "2 jobs run, 3 wait")
        time.sleep(0.6)
        sent = time.monotonic()
        crewd.proc.send_signal(signal.SIGTERM)
        seen = wait_until(lambda: visible(d, "[data-shutdown]"), 3)
        t = time.monotonic() - sent
        check(seen and t <= SLOWDOWN, f"the shutdown banner within 1 s of SIGTERM (at {t:.2f} s)")
        reports = wait_until(lambda: d.execute_script(
            "return [...document.querySelectorAll('[data-report-pool]')].map(e => Object.assign({}, e.dataset))")
            if d.execute_script("return document.querySelectorAll('[data-report-pool]').length") == 2
            else None, 10)
        check(reports, f"the page shows both pools' reports ({reports})")
        code = crewd.stop(None, timeout=25)
        check(code == 0, f"crewd exits 0 (got {code})")
        logged = {m.group(1): m for m in REPORT.finditer(crewd.log())}
        check(set(logged) == {"compute", "jobs"}, f"crewd logs both reports ({sorted(logged)})")
        for r in reports or []:
            m = logged.get(r["reportPool"])
            if not m:
                continue
            shown = [r[f"life_{k}"] for k in ("succeeded", "failed", "cancelled", "timed_out", "rejected")] + \
                    [r[f"during_{k}"] for k in ("succeeded", "cancelled", "timed_out", "rejected")]
            check(shown == list(m.groups()[2:]),
                  f"pool {r['reportPool']}: the page's counts {shown} match the log's {list(m.groups()[2:])}")
        jobs = logged.get("jobs")
        check(jobs and jobs.group(11) == "3", "the soft stop rejected the 3 queued jobs")


def case_stale(binary, _shots):
    port = free_port()
    with Session(binary, port=port) as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        check(wait_until(lambda: not visible(d, "div[data-stale]"), 2), "no stale banner while crewd answers")
        stopped = time.monotonic()
        crewd.stop(signal.SIGKILL)
        seen = wait_until(lambda: visible(d, "div[data-stale]"), 5)
        t = time.monotonic() - stopped
        check(seen and t <= 3 * SLOWDOWN, f"the stale banner within 3 s of crewd stopping (at {t:.2f} s)")
        check(re.match(r"\d+ s ago", d.execute_script(
            "return document.querySelector('[data-updated-ago]').textContent")), "'updated N s ago' shows")
        s.crewd = crewd = Crewd(binary, port=port)
        restarted = time.monotonic()
        cleared = wait_until(lambda: not visible(d, "div[data-stale]"), 5)
        t = time.monotonic() - restarted
        check(cleared and t <= 3 * SLOWDOWN, f"restarting crewd clears it (at {t:.2f} s)")


def case_hidden(binary, _shots):
    with Session(binary) as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        route = r'crewd_http_requests_total\{route="/api/v1/ui/snapshot",status="200"\}'
        first = d.current_window_handle
        d.switch_to.new_window("tab")  # the console's tab is hidden now
        time.sleep(0.5)  # a poll in flight may still land
        before = metric(crewd, route)
        time.sleep(2)
        during = metric(crewd, route) - before
        check(during == 0, f"no snapshot requested in 2 s while the tab is hidden ({during:.0f})")
        d.switch_to.window(first)
        check(wait_until(lambda: metric(crewd, route) > before, 2),
              "polling resumes once the tab is visible again")


def resp(*words):
    """One Redis command in RESP."""
    out = f"*{len(words)}\r\n".encode()
    for w in words:
        b = str(w).encode()
        out += f"${len(b)}\r\n".encode() + b + b"\r\n"
    return out


def case_redis(binary, _shots):
    server = shutil.which("redis-server")
    if not server:
        print("skip  redis-server is not installed (scripts/deps.sh test installs it)")
        return "skip"
    port = free_port()
    redis = subprocess.Popen([server, "--port", str(port), "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        check(wait_until(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 5),
              "redis-server answers")
        with Session(binary, "--redis-address", f"127.0.0.1:{port}", "--redis-max-attempts",
                     "1") as s:
            crewd, d = s.crewd, s.d
            check(open_console(d, crewd), "the console renders its pools")
            with socket.create_connection(("127.0.0.1", port), timeout=5) as r:
                r.sendall(resp("XADD", "crew:jobs", "*", "kind", "nap", "ms", "1") +
                          resp("XADD", "crew:jobs", "*", "kind", "sleep", "ms", "10"))
                r.recv(4096)
            text = lambda: d.execute_script(
                "const e = document.querySelector('[data-redis-section]');"
                "return e && !e.hidden ? e.textContent : '';")
            shown = wait_until(lambda: "kind must be" in text() and "connectedyes" in text(), 5)
            check(shown, f"the Redis section shows the connection and the dead letter's error "
                  f"({text()[:200]!r})")
    finally:
        redis.kill()
        redis.wait(timeout=10)


def case_queued(binary, _shots):
    n = 10_000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < n + 200:
        check(False, f"the descriptor limit ({hard}) allows {n} connections")
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # 10,000 jobs stand queued on purpose (the Session runs crewd without
    # its overload controller). A stuck job holds the one worker; the sleep
    # jobs' starts queue behind it.
    with Session(binary, "--jobs-workers", "1", "--jobs-queue", "20000",
                 "--jobs-queue-timeout-ms", "600000", "--http-backlog", "4096",
                 "--jobs-allow-stuck", "true", "--jobs-max-in-flight", "20000") as s:
        crewd, d = s.crewd, s.d
        socks = []
        s.closers.append(lambda: [k.close() for k in socks])
        s.submit(kind="stuck", ms=60000, timeout_ms=60000, name="holder")
        check(wait_until(lambda: crewd.jobs_pool()["busy"] == 1, 5), "a stuck job holds the worker")
        body = json.dumps({"kind": "sleep", "ms": 60000, "timeout_ms": 60000, "name": "q"}).encode()
        req = (b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        for _ in range(n):  # all queued behind the holder
            c = socket.create_connection(("127.0.0.1", crewd.port), timeout=10)
            c.sendall(req)
            socks.append(c)
        check(wait_until(lambda: crewd.jobs_pool()["queued"] >= n, 30), f"{n} jobs queued")
        sizes, costs, fetch = [], [], []
        for _ in range(7):
            t = time.monotonic()
            with urllib.request.urlopen(crewd.origin + "/api/v1/ui/snapshot", timeout=5) as r:
                raw = r.read()
            fetch.append((time.monotonic() - t) * 1000)
            snap = json.loads(raw)
            sizes.append(len(raw))
            costs.append(snap["cost"]["build_ms"])
        costs.sort()
        fetch.sort()
        check(max(sizes) < 64 * 1024, f"the snapshot is under 64 KB ({max(sizes)} bytes)")
        # The 5 ms figure is the release build's. A sanitizer build's cost
        # (26 ms under TSan on a 2-CPU CI machine, 5-10x release) says
        # nothing about the product, so there it is printed, not checked.
        built = (f"(median {costs[3]:.2f} ms of 7, max {costs[-1]:.2f}; "
                 f"fetched in {fetch[3]:.1f} ms)")
        if SLOWDOWN == 1.0:
            check(costs[len(costs) // 2] < 5, f"it takes under 5 ms to build {built}")
        else:
            print(f"info  built in a sanitizer build {built}", flush=True)
        check(snap["totals"]["queued"] == n and snap["omitted"]["queued"] == n - len(snap["queued"]),
              f"it says it left out {snap['omitted']['queued']} of {n} queued rows")
        check(open_console(d, crewd), "the console renders its pools")
        shown = wait_until(lambda: attr(d, "[data-omitted-queued]", "data-omitted"), 3)
        text = d.execute_script("return document.querySelector('[data-omitted-queued]').textContent")
        check(shown == str(snap["omitted"]["queued"]) and "not shown" in text,
              f"the page says how many rows it left out ({text!r})")
        cost = d.execute_script("return document.querySelector('[data-cost]').textContent")
        check("snapshot cost" in cost, f"and shows the snapshot's cost ({cost!r})")
        check(metric(crewd, r"crewd_ui_snapshot_seconds_count") >= 7,
              "crewd_ui_snapshot_seconds counts the snapshots")


CASES = {
    "page": case_page, "busy": case_busy, "overdue": case_overdue, "cancel": case_cancel,
    "readonly": case_readonly, "hostile": case_hostile, "shutdown": case_shutdown,
    "stale": case_stale, "hidden": case_hidden, "redis": case_redis, "queued": case_queued,
    "request_id": case_request_id,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crewd", required=True)
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--shots", help="directory for the screenshots of case 'page'")
    ap.add_argument("--slowdown", type=float, default=1.0,
                    help="multiplies every bound (sanitizer builds)")
    args = ap.parse_args()
    global SLOWDOWN
    SLOWDOWN = args.slowdown
    missing = [p for p in ("chromium", "chromedriver") if not shutil.which(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("python3-selenium")
    if missing:
        print("missing: " + ", ".join(missing) + " (scripts/deps.sh test installs them)")
        return 1 if os.environ.get("CI") else SKIP
    names = args.case or sorted(CASES)
    skipped = 0
    for name in names:
        print(f"== {name}", flush=True)
        try:
            skipped += CASES[name](args.crewd, args.shots) == "skip"
        except Exception as e:  # a failed step: report it, go on with the next case
            check(False, f"case {name} raised {type(e).__name__}: {e}")
    print(f"{len(failures)} failure(s)")
    if failures:
        return 1
    return SKIP if skipped == len(names) else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the cases of crewd_console_test.py share: check() and bounded
waits, crewd as a child process (Crewd), the headless browser and the
helpers that read the page, a Session of both for one case, and a small
HTTP server for another origin or a proxy. main() sets SLOWDOWN from
--slowdown; the cases read it as harness.SLOWDOWN, at the time they run.
"""
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

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
    # Chromium leaves a directory for its singleton socket in TMPDIR
    # (org.chromium.Chromium.*) behind even when it quits normally: each
    # browser gets a TMPDIR of its own, removed when it quits.
    tmp = tempfile.mkdtemp(prefix="crewd-console-chromium-")
    try:
        service = Service(executable_path=shutil.which("chromedriver"),
                          env={**os.environ, "TMPDIR": tmp})
        d = webdriver.Chrome(service=service, options=opts)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    quit_browser = d.quit

    def quit_and_clean():
        try:
            quit_browser()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    d.quit = quit_and_clean
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

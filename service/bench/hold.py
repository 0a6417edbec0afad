#!/usr/bin/env python3
"""crewd against clients that hold connections: the figures of docs/crewd.md
("Figures: hostile clients"). Loopback only; every run is bounded.

  python3 service/bench/hold.py hold    [--idle 10000] [--slow 2000] [--seconds 30]
  python3 service/bench/hold.py sigterm [--idle 10000] [--slow 2000] [--runs 20]
  python3 service/bench/hold.py headers [--clients 8] [--mib 1]
  python3 service/bench/hold.py limit   [--max 1000] [--idle 1500] [--slow 1000]
  python3 service/bench/hold.py flood   [--clients 2] [--seconds 5]

  common: [--crewd build/service/crewd] [--arg=--flag --arg=value ...] (extra crewd flags)

hold     keeps `idle` keep-alive connections (each served one request, then
         silent) and `slow` connections trickling a request head (a byte per
         second each: slowloris) open for `seconds`, reopening those crewd
         closes (idle timeout, 408) as an attacker would; meanwhile a separate
         process probes GET /healthz on a fresh connection every 10 ms.
         Prints the probes' p50/p99/max, the connections held, and crewd's
         peak RSS.
sigterm  the same load, then SIGTERM: time to exit and exit code, per run.
headers  `clients` concurrent requests each with `mib` MiB of header fields:
         their statuses and crewd's RSS before and after.
limit    crewd with --http-max-connections `max`: `idle` idle connections,
         then `slow` trickling ones, then probes: what each gets.
flood    crewd with one I/O thread; `clients` processes each send a request
         crewd refuses (400), then write as fast as they can while crewd
         lingers on the close, and start over; meanwhile the probes of
         `hold` for `seconds`. Prints the probes' p50/p99/max.

Raises its own descriptor limit (ulimit -n) to the hard limit; crewd does the
same for itself. Needs nothing beyond python3.
"""
import argparse
import multiprocessing
import os
import re
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
SLOW_START = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def start_crewd(path, extra):
    proc = subprocess.Popen([path, "--listen", "127.0.0.1:0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 20
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:([0-9]+)", line)
        if m:
            # Keep draining the log so that crewd never blocks on a full pipe.
            drain = multiprocessing.Process(target=_drain, args=(proc.stdout.fileno(),),
                                            daemon=True)
            drain.start()
            return proc, int(m.group(1))
    proc.kill()
    sys.exit("crewd did not start:\n" + "".join(lines))


def _drain(fd):
    with os.fdopen(fd, "rb", closefd=False) as f:
        while f.read(65536):
            pass


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


# ---- probes, in a process of their own (no GIL shared with the holder) ----

def probe_loop(port, seconds, interval, out):
    latencies, failures = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            if data.startswith(b"HTTP/1.1 200"):
                latencies.append((time.monotonic() - t0) * 1000)
            else:
                failures += 1
        except OSError:
            failures += 1
        left = interval - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
    out.put((latencies, failures))


# ---- the holder: idle and slow connections on one epoll loop ----

class Holder:
    def __init__(self, port, idle, slow):
        self.port = port
        self.want = {"idle": idle, "slow": slow}
        self.sel = selectors.DefaultSelector()
        self.conns = {}  # fd -> [sock, kind, state, buffer]
        self.held = {"idle": 0, "slow": 0}
        self.opening = {"idle": 0, "slow": 0}
        self.closed_by_crewd = {"idle": 0, "slow": 0}
        self.slow_list = []
        self.trickle_at = 0
        self.connect_errors = 0

    def open(self, kind):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", self.port))
        if err not in (0, 115):  # EINPROGRESS
            s.close()
            self.connect_errors += 1
            return
        self.conns[s.fileno()] = [s, kind, "connecting", b""]
        self.opening[kind] += 1
        self.sel.register(s, selectors.EVENT_WRITE)

    def close(self, fd, by_crewd):
        sock, kind, state, _ = self.conns.pop(fd)
        self.sel.unregister(sock)
        sock.close()
        if state in ("held", "trickling"):
            self.held[kind] -= 1
            if by_crewd:
                self.closed_by_crewd[kind] += 1
        else:
            self.opening[kind] -= 1

    def top_up(self, budget):
        for kind in ("idle", "slow"):
            missing = self.want[kind] - self.held[kind] - self.opening[kind]
            for _ in range(min(missing, budget)):
                self.open(kind)
                budget -= 1

    def step(self, timeout):
        for key, events in self.sel.select(timeout):
            fd = key.fd
            if fd not in self.conns:
                continue
            c = self.conns[fd]
            sock, kind, state = c[0], c[1], c[2]
            if state == "connecting":
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                    self.connect_errors += 1
                    self.close(fd, False)
                    continue
                try:
                    sock.send(REQUEST if kind == "idle" else SLOW_START)
                except OSError:
                    self.close(fd, False)
                    continue
                c[2] = "requested" if kind == "idle" else "trickling"
                if kind == "slow":
                    self.opening[kind] -= 1
                    self.held[kind] += 1
                self.sel.modify(sock, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.close(fd, True)
                continue
            if state == "requested":
                c[3] += data
                if c[3].endswith(b"}"):  # {"status":"ok"}
                    c[2] = "held"
                    c[3] = b""
                    self.opening[kind] -= 1
                    self.held[kind] += 1
            # A slow connection that gets data got its 408: crewd closes it next.

    def trickle(self):
        # A byte per second per slow connection, spread over 20 ticks.
        now = time.monotonic()
        if now < self.trickle_at:
            return
        self.trickle_at = now + 0.05
        slow = [c for c in self.conns.values() if c[2] == "trickling"]
        n = max(1, len(slow) // 20)
        start = int(now * 20) % 20
        for c in slow[start * n:(start + 1) * n]:
            try:
                c[0].send(b"x")
            except OSError:
                pass


def hold(a, seconds, crewd=None):
    """Runs the holder for `seconds` with probes; returns figures."""
    own = crewd is None
    if own:
        crewd, port = start_crewd(a.crewd, a.arg)
    else:
        crewd, port = crewd
    h = Holder(port, a.idle, a.slow)
    # Fill first (bounded), then measure while holding.
    fill_end = time.monotonic() + 60
    while time.monotonic() < fill_end and (h.held["idle"] < a.idle or h.held["slow"] < a.slow):
        h.top_up(500)
        h.step(0.01)
        h.trickle()
    filled = dict(h.held)
    out = multiprocessing.Queue()
    prober = multiprocessing.Process(target=probe_loop, args=(port, seconds, 0.01, out))
    prober.start()
    peak_rss, samples, next_sample = 0.0, [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        h.top_up(200)
        h.step(0.01)
        h.trickle()
        if time.monotonic() >= next_sample:
            next_sample = time.monotonic() + 0.5
            rss = rss_mib(crewd.pid)
            peak_rss = max(peak_rss, rss)
            samples.append((dict(h.held), rss))
    latencies, failures = out.get(timeout=30)
    prober.join()
    held_min = {k: min(s[0][k] for s in samples) for k in ("idle", "slow")}
    held_avg = {k: statistics.mean(s[0][k] for s in samples) for k in ("idle", "slow")}
    figures = {
        "filled": filled, "held_min": held_min, "held_avg": held_avg,
        "closed_by_crewd": dict(h.closed_by_crewd), "connect_errors": h.connect_errors,
        "probes": len(latencies), "probe_failures": failures,
        "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
        "max": max(latencies) if latencies else float("nan"),
        "peak_rss_mib": peak_rss, "holder": h,
    }
    if own:
        stop(crewd)
        for fd in list(h.conns):
            h.close(fd, False)
    return figures, (crewd, port)


def stop(proc, timeout=60):
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def print_hold(f, a, seconds):
    print(f"held for {seconds} s: idle {f['held_avg']['idle']:.0f} on average "
          f"(min {f['held_min']['idle']}), slow {f['held_avg']['slow']:.0f} "
          f"(min {f['held_min']['slow']}); crewd closed {f['closed_by_crewd']['idle']} idle, "
          f"{f['closed_by_crewd']['slow']} slow (reopened); connect errors "
          f"{f['connect_errors']}")
    print(f"/healthz probes: {f['probes']} ok, {f['probe_failures']} failed; "
          f"p50 {f['p50']:.2f} ms, p99 {f['p99']:.2f} ms, max {f['max']:.2f} ms")
    print(f"crewd peak RSS {f['peak_rss_mib']:.1f} MiB")


def cmd_hold(a):
    f, _ = hold(a, a.seconds)
    print_hold(f, a, a.seconds)


def cmd_sigterm(a):
    results = []
    for run in range(a.runs):
        crewd, port = start_crewd(a.crewd, a.arg)
        f, _ = hold(a, a.seconds, (crewd, port))
        t0 = time.monotonic()
        crewd.send_signal(signal.SIGTERM)
        h = f["holder"]
        # Keep the load on (slowloris keeps trickling; closed ones are not
        # reopened: the listener is closing) until crewd exits.
        h.want = {"idle": 0, "slow": 0}
        code = None
        deadline = t0 + 120
        while time.monotonic() < deadline:
            code = crewd.poll()
            if code is not None:
                break
            h.step(0.01)
            h.trickle()
        took = time.monotonic() - t0
        if code is None:
            crewd.kill()
            crewd.wait()
        for fd in list(h.conns):
            h.close(fd, False)
        results.append((code, took))
        print(f"run {run + 1}: held idle {f['held_avg']['idle']:.0f}, slow "
              f"{f['held_avg']['slow']:.0f}; SIGTERM -> exit {code} in {took:.2f} s", flush=True)
    ok = sum(1 for c, _ in results if c == 0)
    times = [t for _, t in results]
    print(f"{ok} of {len(results)} runs exited 0; SIGTERM to exit median "
          f"{statistics.median(times):.2f} s, max {max(times):.2f} s")


def cmd_headers(a):
    crewd, port = start_crewd(a.crewd, a.arg)
    time.sleep(0.5)
    before = rss_mib(crewd.pid)
    line = b"X-H: v\r\n"
    payload = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + line * (a.mib * (1 << 20) // len(line))

    def one(q):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        t0 = time.monotonic()
        status = None
        try:
            s.setblocking(False)
            sent, data = 0, b""
            while time.monotonic() - t0 < 10:
                if sent < len(payload):
                    try:
                        sent += s.send(payload[sent:sent + 65536])
                    except BlockingIOError:
                        pass
                    except OSError:
                        sent = len(payload)
                try:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                    if b"\r\n\r\n" in data:
                        status = int(data[9:12])
                        break
                except BlockingIOError:
                    time.sleep(0.001)
                except OSError:
                    break
            q.put((status, sent, time.monotonic() - t0))
        finally:
            s.close()

    q = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=one, args=(q,)) for _ in range(a.clients)]
    peak = before
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        peak = max(peak, rss_mib(crewd.pid))
        time.sleep(0.01)
    results = [q.get() for _ in procs]
    time.sleep(0.5)
    after = rss_mib(crewd.pid)
    stop(crewd)
    for status, sent, took in results:
        print(f"status {status} after {sent / (1 << 20):.2f} MiB sent, {took * 1000:.0f} ms")
    print(f"crewd RSS before {before:.1f} MiB, peak {peak:.1f} MiB, after {after:.1f} MiB "
          f"(growth {peak - before:.1f} MiB)")


def cmd_limit(a):
    extra = ["--http-max-connections", str(a.max), *a.arg]
    crewd, port = start_crewd(a.crewd, extra)
    h = Holder(port, 0, 0)  # opens only what is asked below; nothing is reopened

    def settle(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            h.step(0.01)
            h.trickle()

    for _ in range(a.idle):
        h.open("idle")
        h.step(0)
    settle(1)
    print(f"{a.idle} idle connections opened one after the other, max {a.max}: "
          f"{h.held['idle']} held, {h.closed_by_crewd['idle']} closed by crewd (the oldest "
          f"idle ones make room)")
    for _ in range(a.slow):
        h.open("slow")
        h.step(0)
    settle(1)
    print(f"then {a.slow} trickling connections: {h.held['slow']} held, "
          f"{h.closed_by_crewd['slow']} answered 503 and closed; idle left {h.held['idle']}")
    statuses = {}
    t = []
    for _ in range(20):
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = s.recv(4096)
            st = data[9:12].decode() if data else "closed"
        except OSError as e:
            st = type(e).__name__
        t.append((time.monotonic() - t0) * 1000)
        statuses[st] = statuses.get(st, 0) + 1
    print(f"then 20 probes: {statuses}, median {statistics.median(t):.2f} ms")
    stop(crewd)


def _flood_client(port, end):
    chunk = b"x" * 65536
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"BAD\x01 / HTTP/1.1\r\n\r\n")
                until = min(end, time.monotonic() + 1.2)
                while time.monotonic() < until:
                    s.sendall(chunk)
        except OSError:
            pass  # crewd closed the connection at its linger deadline


def cmd_flood(a):
    crewd, port = start_crewd(a.crewd, ["--http-io-threads", "1", *a.arg])
    end = time.monotonic() + a.seconds + 0.5
    clients = [multiprocessing.Process(target=_flood_client, args=(port, end))
               for _ in range(a.clients)]
    for c in clients:
        c.start()
    time.sleep(0.5)
    q = multiprocessing.Queue()
    probe = multiprocessing.Process(target=probe_loop, args=(port, a.seconds, 0.01, q))
    probe.start()
    latencies, failures = q.get()
    probe.join()
    for c in clients:
        c.join()
    stop(crewd)
    print(f"{a.clients} clients sending into their lingering close for {a.seconds} s: /healthz "
          f"p50 {percentile(latencies, 50):.2f} ms, p99 {percentile(latencies, 99):.2f} ms, "
          f"max {percentile(latencies, 100):.2f} ms ({len(latencies)} probes, {failures} failed)")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["hold", "sigterm", "headers", "limit", "flood"])
    ap.add_argument("--crewd", default="build/service/crewd")
    ap.add_argument("--arg", action="append", default=[], help="an extra crewd argument")
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=None,
                    help="hold: 30; sigterm (held before the signal), flood: 5")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--clients", type=int, default=None,
                    help="headers: 8 concurrent requests; flood: 2 clients")
    ap.add_argument("--mib", type=int, default=1)
    ap.add_argument("--max", type=int, default=1000)
    a = ap.parse_args()
    hard = raise_nofile()
    if a.mode in ("hold", "sigterm") and a.idle + a.slow + 100 > hard:
        sys.exit(f"ulimit -Hn is {hard}: not enough descriptors for {a.idle + a.slow} connections")
    if a.seconds is None:
        a.seconds = 30 if a.mode == "hold" else 5
    if a.clients is None:
        a.clients = 2 if a.mode == "flood" else 8
    {"hold": cmd_hold, "sigterm": cmd_sigterm, "headers": cmd_headers, "limit": cmd_limit,
     "flood": cmd_flood}[a.mode](a)


if __name__ == "__main__":
    main()

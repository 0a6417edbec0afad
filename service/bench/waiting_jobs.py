#!/usr/bin/env python3
"""Jobs that wait (docs/crewd.md, "Jobs that wait"): sleep and call jobs are
coroutine tasks of crewd's jobs pool and hold no thread while they wait.
Three figures, each against a fresh crewd on a free loopback port:

  sleep     N concurrent sleep jobs of 1 s with jobs.workers = 2 (default
            N 10,000), all sent before any answer is read: how many answered
            200, when the last request was sent and the last answer came
            after the first request, and the slowest job from its request to
            its answer (the figure: all within 3 s).
  call      call jobs against a downstream that answers after 1 s (a process
            of its own, started here), jobs.max_in_flight = 1000, from 1000
            keep-alive connections each sending its next job when the last
            one is answered, for --duration seconds: jobs answered per second
            (the figure: 1,000/s sustained), their statuses, and crewd's peak
            RSS (VmHWM; the figure: under 100 MiB).
  call-open call jobs as above, from the C++ open-loop generator
            (bench/loadgen, --loadgen): Poisson arrivals at 1,000 jobs/s for
            --duration seconds, once with jobs.max_in_flight = 1000 and once
            with 1100 (--open-caps). Per cap: jobs answered 200 per second,
            the 503s (max_in_flight), the latency p50/p99 from the send, and
            crewd's peak RSS. The closed loop above never offers more than
            1,000 jobs at a time; an open loop shows what the cap does to
            arrivals that do not wait for each other (docs/bench/
            crewd-waiting-jobs.md, "Calls at the cap").
  sigterm-drain, sigterm-soft
            N suspended sleep jobs (default 5,000), then SIGTERM with
            shutdown.timeout_ms 5000 and shutdown.termination_timeout_ms 10000:
            in drain jobs of 2 s (each ends within the drain: 200), in soft
            jobs of 60 s (each is stopped at once: 503, outcome cancelled).
            crewd's exit code and time from the signal, every answer's status
            and outcome, and the jobs pool's report line.

  python3 service/bench/waiting_jobs.py [--crewd build/service/crewd]
      [--figure sleep|call|call-open|sigterm-drain|sigterm-soft|all] [--rounds 3]
      [--sleep-jobs 10000] [--duration 10] [--sigterm-jobs 5000]
      [--loadgen build/bench/loadgen/loadgen] [--open-caps 1000,1100]

Each round runs the figures in turn (interleaved over rounds: the machine is
shared), and the medians are printed as a Markdown table. Needs only
Python 3 (asyncio); raises its descriptor limit to the hard limit.
"""
import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time

DOWNSTREAM = r'''
import asyncio, sys
async def handle(r, w):
    try:
        await r.readuntil(b"\r\n\r\n")
        await asyncio.sleep(float(sys.argv[2]))
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await w.drain()
    except Exception:
        pass
    w.close()
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=8192)
    print("ready", flush=True)
    async with s:
        await s.serve_forever()
asyncio.run(main())
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Crewd:
    def __init__(self, binary, *flags):
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--http-backlog", "8192", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        deadline = time.monotonic() + 10
        self.port = 0
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            raise SystemExit("crewd did not start:\n" + "".join(self.lines))

    def rss_peak_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self, timeout=30, signal_it=True):
        if signal_it and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.lines.extend(self.proc.stdout.readlines())
        return code


def request(body):
    data = json.dumps(body).encode()
    return (b"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)


async def read_answer(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    body = await reader.readexactly(length)
    return status, json.loads(body)


def burst(port, body, n, bound=60.0):
    """Sends n job requests, each on its own connection, all before reading any
    answer (blocking connect and send: cheap on loopback), then reads the
    answers with a selector. Returns (status, outcome, sent, answered) per job;
    status -1 for none within `bound` seconds."""
    import selectors
    req = request(body)
    sel = selectors.DefaultSelector()
    state = {}
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(req)
        sent = time.monotonic()
        s.setblocking(False)
        state[s] = [b"", sent]
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + bound
    while state and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            buf, sent = state[s]
            buf += data
            state[s][0] = buf
            end = buf.find(b"\r\n\r\n")
            done = not data
            if end >= 0:
                m = re.search(rb"(?i)content-length: *(\d+)", buf[:end])
                if m and len(buf) >= end + 4 + int(m.group(1)):
                    done = True
            if done:
                now = time.monotonic()
                sel.unregister(s)
                s.close()
                del state[s]
                try:
                    status = int(buf.split(b" ", 2)[1])
                    outcome = json.loads(buf[end + 4:]).get("outcome")
                except (IndexError, ValueError):
                    status, outcome = -1, "closed"
                out.append((status, outcome, sent, now))
    for s, (_, sent) in state.items():
        out.append((-1, "no answer", sent, time.monotonic()))
        s.close()
    return out


def counts(out):
    c = {}
    for status, outcome, *_ in out:
        key = f"{status} {outcome}"
        c[key] = c.get(key, 0) + 1
    return c


def figure_sleep(binary, n):
    crewd = Crewd(binary, "--jobs-workers", "2", "--jobs-max-in-flight", str(max(n, 10000)))
    start = time.monotonic()
    out = burst(crewd.port, {"kind": "sleep", "ms": 1000}, n)
    sent_all = max(o[2] for o in out) - start
    last = max(o[3] for o in out) - start
    worst = max(o[3] - o[2] for o in out)
    rss = crewd.rss_peak_mib()
    code = crewd.stop()
    ok = sum(1 for o in out if o[0] == 200)
    print(f"  sleep: {ok}/{n} answered 200; all sent by {sent_all:.2f} s, the last answer at "
          f"{last:.2f} s after the first request; slowest job {worst:.2f} s from its request to "
          f"its answer; RSS peak {rss:.1f} MiB; exit {code}; {counts(out)}", flush=True)
    return {"ok": ok, "sent_s": sent_all, "last_s": last, "worst_s": worst, "rss_mib": rss}


async def call_loop(port, conns, duration, out):
    stop_at = time.monotonic() + duration

    async def worker():
        reader = writer = None
        while time.monotonic() < stop_at:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request({"kind": "call"}))
                await writer.drain()
                status, doc = await read_answer(reader)
                out.append((status, doc.get("outcome"), 0.0, time.monotonic()))
                if status == 503:
                    await asyncio.sleep(0.05)
            except Exception as e:  # noqa: BLE001 -- counted, then a new connection
                out.append((-1, type(e).__name__, 0.0, time.monotonic()))
                writer = None
        if writer is not None:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(conns)))


@contextlib.contextmanager
def crewd_with_downstream(binary, max_in_flight):
    """A downstream that answers every request after 1 s (a process of its
    own) and a crewd whose call jobs GET it, with jobs.max_in_flight as
    given; the downstream is killed on the way out."""
    port = free_port()
    ds = subprocess.Popen([sys.executable, "-c", DOWNSTREAM, str(port), "1.0"],
                          stdout=subprocess.PIPE, text=True)
    try:
        ds.stdout.readline()
        yield Crewd(binary, "--jobs-max-in-flight", str(max_in_flight), "--jobs-call-url",
                    f"http://127.0.0.1:{port}/slow", "--http-keep-alive-max", "100000")
    finally:
        ds.kill()
        ds.wait()


def figure_call(binary, duration, conns=1000):
    with crewd_with_downstream(binary, 1000) as crewd:
        out = []
        start = time.monotonic()
        asyncio.run(call_loop(crewd.port, conns, duration, out))
        # The rate over the steady part: from the second second to the end.
        window = [o[3] for o in out if o[0] == 200 and o[3] - start >= 2.0]
        span = (max(window) - min(window)) if len(window) > 1 else 1.0
        rate = (len(window) - 1) / span if span > 0 else 0.0
        rss = crewd.rss_peak_mib()
        code = crewd.stop()
    print(f"  call: {rate:.0f} jobs/s answered 200 (steady part), {len(out)} answers; "
          f"RSS peak {rss:.1f} MiB; exit {code}; {counts(out)}", flush=True)
    return {"rate": rate, "rss_mib": rss}


def figure_call_open(binary, loadgen, duration, cap, rate=1000):
    with crewd_with_downstream(binary, cap) as crewd:
        summary = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"call-open-{os.getpid()}.json")
        subprocess.run([loadgen, "--url", f"http://127.0.0.1:{crewd.port}/api/v1/jobs",
                        "--body", json.dumps({"kind": "call"}),
                        "--header", "Content-Type: application/json",
                        "--rate", str(rate), "--duration", str(duration),
                        "--slo-ms", "1500", "--timeout-ms", "5000",
                        "--connections", str(cap + 100), "--max-connections", "4096",
                        "--json", summary, "--quiet"],
                       check=True, timeout=duration + 60)
        with open(summary) as f:
            d = json.load(f)
        os.unlink(summary)
        rss = crewd.rss_peak_mib()
        code = crewd.stop()
    # Per second from the 2nd on (the first second's answers are still due).
    steady = [p for p in d["per_second"] if 2 <= p["t"] < duration]
    ok_rate = statistics.mean(p["ok"] for p in steady) if steady else 0.0
    refused = sum(n for k, n in d["status"].items() if k == "503")
    lat = d["latency_2xx_ms"]
    print(f"  call-open (max_in_flight {cap}): {ok_rate:.0f} jobs/s answered 200 (steady part) "
          f"of {d['achieved_rate']:.0f}/s sent; statuses {d['status']}; 200s p50 "
          f"{lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms; RSS peak {rss:.1f} MiB; exit {code}",
          flush=True)
    return {"rate": ok_rate, "sent_rate": d["achieved_rate"], "refused": refused,
            "answered": d["answered"], "p50": lat["p50"], "p99": lat["p99"], "rss_mib": rss}


def figure_sigterm(binary, n, mode):
    """drain: jobs of 2 s, all end within the drain (200). soft: jobs of 60 s,
    all stopped at once (503 cancelled). shutdown.timeout_ms 5000,
    shutdown.termination_timeout_ms 10000 (the configured bound)."""
    crewd = Crewd(binary, "--jobs-workers", "2", "--jobs-max-in-flight", str(max(n, 10000)),
                  "--jobs-max-ms", "60000", "--jobs-max-timeout-ms", "120000",
                  "--shutdown-mode", mode, "--shutdown-timeout-ms", "5000",
                  "--shutdown-termination-timeout-ms", "10000")
    body = ({"kind": "sleep", "ms": 2000} if mode == "drain"
            else {"kind": "sleep", "ms": 60000, "timeout_ms": 90000})
    result = {}

    def signal_when_suspended():
        # Until the pool shows every job suspended (bounded), then SIGTERM.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", crewd.port)) as c:
                c.sendall(b"GET /api/v1/pools HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                raw = b""
                while chunk := c.recv(65536):
                    raw += chunk
            doc = json.loads(raw[raw.find(b"\r\n\r\n") + 4:])
            if doc["pools"][1]["suspended"] >= n:
                break
            time.sleep(0.02)
        result["t0"] = time.monotonic()
        crewd.proc.send_signal(signal.SIGTERM)

    import threading
    t = threading.Thread(target=signal_when_suspended)
    t.start()
    out = burst(crewd.port, body, n, bound=30)
    t.join()
    code = crewd.stop(timeout=30, signal_it=False)  # signalled once, above
    took = time.monotonic() - result["t0"]
    report = next((line.strip()[24:] for line in crewd.lines if "pool jobs stopped" in line), "")
    print(f"  sigterm ({mode}): exit {code} {took:.2f} s after the signal; answers {counts(out)}; "
          f"report: {report}", flush=True)
    answered = sum(1 for o in out if o[0] == 200 or (o[0] == 503 and o[1]))
    return {"exit": code, "took_s": took, "answered": answered}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crewd", default="build/service/crewd")
    ap.add_argument("--figure", default="all",
                    choices=["sleep", "call", "call-open", "sigterm-drain", "sigterm-soft",
                             "all"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sleep-jobs", type=int, default=10000)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--sigterm-jobs", type=int, default=5000)
    ap.add_argument("--loadgen", default="build/bench/loadgen/loadgen")
    ap.add_argument("--open-caps", default="1000,1100",
                    help="jobs.max_in_flight values of the call-open figure")
    a = ap.parse_args()
    caps = [int(c) for c in a.open_caps.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    figures = (["sleep", "call", "call-open", "sigterm-drain", "sigterm-soft"]
               if a.figure == "all" else [a.figure])
    results = {f: [] for f in figures if f != "call-open"}  # call-open: one per cap
    for r in range(a.rounds):
        print(f"round {r + 1} (load {os.getloadavg()[0]:.2f})", flush=True)
        for f in figures:
            if f == "sleep":
                results[f].append(figure_sleep(a.crewd, a.sleep_jobs))
            elif f == "call":
                results[f].append(figure_call(a.crewd, a.duration))
            elif f == "call-open":
                for cap in caps:
                    results.setdefault(f"call-open-{cap}", []).append(
                        figure_call_open(a.crewd, a.loadgen, a.duration, cap))
            else:
                results[f].append(figure_sigterm(a.crewd, a.sigterm_jobs, f.split("-")[1]))
    med = lambda f, k: statistics.median(x[k] for x in results[f])  # noqa: E731
    print("\n| figure | median of " + str(a.rounds) + " rounds |\n| --- | --- |")
    if "sleep" in results:
        print(f"| {a.sleep_jobs:,} sleep jobs of 1 s, jobs.workers = 2 | "
              f"{med('sleep', 'ok'):.0f} answered 200; sent by {med('sleep', 'sent_s'):.2f} s, "
              f"the last answer at {med('sleep', 'last_s'):.2f} s, slowest job "
              f"{med('sleep', 'worst_s'):.2f} s; RSS peak {med('sleep', 'rss_mib'):.1f} MiB |")
    if "call" in results:
        print(f"| call jobs, 1 s downstream, jobs.max_in_flight = 1000 | "
              f"{med('call', 'rate'):.0f} jobs/s; RSS peak {med('call', 'rss_mib'):.1f} MiB |")
    for cap in caps:
        f = f"call-open-{cap}"
        if f in results:
            print(f"| call jobs, 1 s downstream, open loop at 1,000/s, jobs.max_in_flight = {cap} | "
                  f"{med(f, 'rate'):.0f} jobs/s answered 200 of {med(f, 'sent_rate'):.0f}/s sent, "
                  f"{med(f, 'refused'):.0f} refused of {med(f, 'answered'):.0f}; p50 "
                  f"{med(f, 'p50'):.1f} ms, p99 {med(f, 'p99'):.1f} ms; RSS peak "
                  f"{med(f, 'rss_mib'):.1f} MiB |")
    for mode in ("drain", "soft"):
        f = "sigterm-" + mode
        if f in results:
            print(f"| SIGTERM with {a.sigterm_jobs:,} suspended jobs ({mode}) | exit "
                  f"{med(f, 'exit'):.0f} after {med(f, 'took_s'):.2f} s; "
                  f"{med(f, 'answered'):.0f} answered |")

if __name__ == "__main__":
    main()

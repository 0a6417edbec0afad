"""crewd as run.py (and crosscheck.py) runs it: started in a session of
its own, its port read from its log, and its /metrics scraped once a second
while a run lasts.
"""
import re
import subprocess
import threading
import time
import urllib.request


def crewd_port(cmd, nice):
    # A session of its own is a scheduler autogroup of its own (Linux
    # CONFIG_SCHED_AUTOGROUP): the machine's other sessions share the CPU
    # with it by the group's nice, which a process's own nice does not move.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        with open(f"/proc/{proc.pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass  # no autogroups: the process's nice is what counts
    deadline = time.monotonic() + 10
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:([0-9]+)", line)
        if m:
            # Keep reading its output so that it never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    proc.wait()
    return None, "".join(lines[-5:])


def metric_value(text, name):
    """The value of the sample `name` (with its labels, as exported) in a
    Prometheus text page, or None."""
    for line in text.splitlines():
        if line.startswith(name + " ") or (("{" in name) and line.startswith(name)):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


class Scraper(threading.Thread):
    """GET /metrics once a second; keeps (t, queue length, limit) samples."""

    def __init__(self, port, limit_metric):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.limit_metric = limit_metric
        self.samples = []
        self.done = threading.Event()

    def run(self):
        start = time.monotonic()
        while not self.done.wait(1.0):
            try:
                text = urllib.request.urlopen(self.url, timeout=1).read().decode()
            except OSError:
                continue
            self.samples.append({
                "t": round(time.monotonic() - start, 2),
                "queue": metric_value(text, 'crew_queue_length{pool="jobs"}'),
                "limit": metric_value(text, self.limit_metric) if self.limit_metric else None,
            })

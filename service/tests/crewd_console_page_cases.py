"""The console cases about the page and the jobs it shows (page, busy,
overdue, cancel, readonly, hostile, request_id); crewd_console_test.py
describes each.
"""
import json
import os
import time
import urllib.error
import urllib.request

# SLOWDOWN is read through the module (harness.SLOWDOWN): main() sets it
# after this import.
import crewd_console_harness as harness
from crewd_console_harness import (Server, Session, attr, check, click, metric, open_console,
                                   other_origin, read_response, row_state, running_job_id,
                                   wait_until)


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
        check(page and took <= 1.5 * harness.SLOWDOWN, f"the page shows busy 8 within 1.5 s (took {took:.2f} s)")


def case_overdue(binary, _shots):
    with Session(binary, "--jobs-allow-stuck", "true") as s:
        crewd, d = s.crewd, s.d
        check(open_console(d, crewd), "the console renders its pools")
        task, sock = s.run_job("stuck-job", kind="stuck", ms=8000, timeout_ms=1000)
        started = time.monotonic()  # within a poll of the task's start
        check(task, "the stuck job runs")
        seen = wait_until(lambda: row_state(d, task) == "overdue", 4)
        t = time.monotonic() - started
        check(seen and t <= (1 + 2) * harness.SLOWDOWN, f"'overdue' within 2 s of the 1 s deadline (at {t:.2f} s)")
        # The write-off: crewd logs it when the abandon grace (1 s) ends.
        line = crewd.wait_log(r"task abandoned", 5)
        written_off = time.monotonic()
        check(line, "crewd wrote the worker off")
        seen = wait_until(lambda: row_state(d, task) == "abandoned" and
                          attr(d, f"[data-running] tr[data-task-id='{task}']", "data-replacement"), 3)
        t = time.monotonic() - written_off
        worker = attr(d, f"[data-running] tr[data-task-id='{task}']", "data-worker")
        repl = attr(d, f"[data-running] tr[data-task-id='{task}']", "data-replacement")
        check(seen and t <= 2 * harness.SLOWDOWN, f"'abandoned' with its replacement within 2 s of the write-off "
              f"(at {t:.2f} s; worker {worker}, replaced by {repl})")
        check(repl and repl != worker, "the replacement is another worker")
        text = d.execute_script(
            "return document.querySelector(\"[data-running] tr[data-task-id='\" + arguments[0] + \"']\").textContent",
            str(task))
        check(f"replaced by worker {repl}" in text, f"the row names the replacement ({text!r})")
        sock.close()


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
        check(done and t <= harness.SLOWDOWN, f"the row shows 'cancelled' within 1 s of Confirm (at {t:.2f} s)")
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
        s.submit(kind="sleep", ms=int(2000 * harness.SLOWDOWN), timeout_ms=int(5000 * harness.SLOWDOWN),
                 name="traced", request_id=HOSTILE_ID)
        shows = ("return [...document.querySelectorAll(arguments[0] + ' td')]"
                 ".some(td => td.textContent === arguments[1])")
        check(wait_until(lambda: d.execute_script(shows, "[data-running]", HOSTILE_ID), 5 * harness.SLOWDOWN),
              "the running task shows its request id as text")
        check(wait_until(lambda: d.execute_script(shows, "[data-recent]", HOSTILE_ID), 10 * harness.SLOWDOWN),
              "the recent outcome shows its request id as text")
        check(d.execute_script("return document.querySelectorAll('main b').length") == 0,
              "no element was made from it")


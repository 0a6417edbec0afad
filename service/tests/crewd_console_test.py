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
import os
import shutil
import sys

import crewd_console_harness as harness
from crewd_console_harness import check
from crewd_console_page_cases import (case_busy, case_cancel, case_hostile, case_overdue,
                                      case_page, case_readonly, case_request_id)
from crewd_console_state_cases import (case_hidden, case_queued, case_redis, case_shutdown,
                                       case_stale)

SKIP = 77


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
    harness.SLOWDOWN = args.slowdown
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
    print(f"{len(harness.failures)} failure(s)")
    if harness.failures:
        return 1
    return SKIP if skipped == len(names) else 0


if __name__ == "__main__":
    sys.exit(main())

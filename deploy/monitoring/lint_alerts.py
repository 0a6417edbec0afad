#!/usr/bin/env python3
"""Checks the alerts and recording rules against the runbook and the tests.

  lint_alerts.py --rules rules --tests tests --runbook runbook.md

Checks:
  - every alert has a severity label (critical or warning) and the
    annotations summary, description and runbook_url, the latter a link to
    a section of runbook.md that exists (#<alert name in lower case>);
  - every alert has a `for` of at least 1m, and the promtool tests
    (tests/*.yml) expect it both silent and firing at some eval_time;
  - every recording rule is the expression of some promql_expr_test;
  - alert and record names are unique.

Exit 0 when clean, 1 with one line per problem. Needs PyYAML.
"""
import argparse
import os
import re
import sys

import yaml


def load_dir(path):
    docs = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".yml"):
            with open(os.path.join(path, fn), encoding="utf-8") as f:
                docs[fn] = yaml.safe_load(f)
    return docs


def anchors(markdown):
    """GitHub-style anchors of the headings."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def duration_s(d):
    m = re.fullmatch(r"(\d+)([smh])", str(d or "0s"))
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)] if m else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", required=True)
    ap.add_argument("--tests", required=True)
    ap.add_argument("--runbook", required=True)
    a = ap.parse_args()
    problems = []
    with open(a.runbook, encoding="utf-8") as f:
        sections = anchors(f.read())
    runbook = os.path.basename(a.runbook)

    alerts, records, names = [], [], []
    for fn, doc in load_dir(a.rules).items():
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                names.append(rule.get("alert") or rule.get("record"))
                (alerts if "alert" in rule else records).append(rule)
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{dup}: defined more than once")

    silent, firing, tested_exprs = set(), set(), set()
    for fn, doc in load_dir(a.tests).items():
        for test in doc.get("tests", []):
            for t in test.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else silent).add(t["alertname"])
            for t in test.get("promql_expr_test", []):
                tested_exprs.add(t["expr"].strip())

    for rule in alerts:
        name = rule["alert"]
        labels, notes = rule.get("labels", {}), rule.get("annotations", {})
        if labels.get("severity") not in ("critical", "warning"):
            problems.append(f"{name}: severity is not critical or warning")
        for key in ("summary", "description", "runbook_url"):
            if not notes.get(key):
                problems.append(f"{name}: no {key} annotation")
        url = notes.get("runbook_url", "")
        want = f"{runbook}#{name.lower()}"
        if not url.endswith(want):
            problems.append(f"{name}: runbook_url {url!r} does not end with {want!r}")
        if name.lower() not in sections:
            problems.append(f"{name}: {runbook} has no section '{name}'")
        if duration_s(rule.get("for")) < 60:
            problems.append(f"{name}: `for` is under 1m: nothing to test before it fires")
        if name not in firing:
            problems.append(f"{name}: no test expects it firing")
        if name not in silent:
            problems.append(f"{name}: no test expects it silent")
    for rule in records:
        if rule["record"] not in tested_exprs:
            problems.append(f"{rule['record']}: no promql_expr_test evaluates it")

    for p in problems:
        print(p)
    print(f"{len(alerts)} alerts, {len(records)} recording rules: "
          f"{'clean' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

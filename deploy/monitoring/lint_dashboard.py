#!/usr/bin/env python3
"""Lints a Grafana dashboard JSON of the monitoring kit (python3 stdlib only).

  lint_dashboard.py dashboards/crewd.json [--rows Overview,Saturation,...]
  lint_dashboard.py --self-test dashboards/crewd.json

--self-test breaks a copy of the dashboard in each way listed below and
checks that the lint reports each one (and nothing on the original).

Checks:
  - the file is JSON with a title, a uid, a schemaVersion and panels;
  - panel ids are unique, and panels sit inside the 24-column grid without
    overlapping;
  - every row has a title, and the rows named by --rows appear in that order;
  - every other panel has a title, a description, a unit
    (fieldConfig.defaults.unit) and at least one target with an expression,
    whose refIds are unique, and takes its data source from the
    $datasource variable;
  - every $variable an expression uses is defined in templating (Grafana's
    own $__... variables aside);
  - the Latency row holds a heatmap of a histogram's _bucket series.

Exit 0 when clean, 1 with one line per problem otherwise.
"""
import argparse
import json
import re
import sys

DEFAULT_ROWS = "Overview,Saturation,Latency,Outcomes,Scale-out,HTTP,Process"


def lint(dash, want_rows):
    problems = []
    for key in ("title", "uid", "schemaVersion", "panels"):
        if not dash.get(key):
            problems.append(f"dashboard: no {key}")
    variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    panels = dash.get("panels", [])
    # Rows may hold their panels (collapsed) or precede them (expanded).
    flat = []
    for p in panels:
        flat.append(p)
        flat.extend(p.get("panels", []) if p.get("type") == "row" else [])

    ids = [p.get("id") for p in flat]
    for dup in sorted({i for i in ids if ids.count(i) > 1}, key=str):
        problems.append(f"panel id {dup} used more than once")

    cells = {}
    rows, current_row, heatmap_rows = [], None, set()
    for p in flat:
        name = f"panel {p.get('id')} ({p.get('title') or 'untitled'})"
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")):
            problems.append(f"{name}: gridPos needs integer x, y, w, h")
        elif g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24:
            problems.append(f"{name}: outside the 24-column grid")
        else:
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in cells:
                        problems.append(f"{name}: overlaps {cells[(x, y)]}")
                        break
                    cells[(x, y)] = name
                else:
                    continue
                break
        if p.get("type") == "row":
            if not p.get("title"):
                problems.append(f"{name}: a row without a title")
            current_row = p.get("title")
            rows.append(current_row)
            continue
        if not p.get("title"):
            problems.append(f"{name}: no title")
        if not p.get("description"):
            problems.append(f"{name}: no description")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append(f"{name}: no unit (fieldConfig.defaults.unit)")
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{name}: data source is not ${{datasource}}")
        targets = p.get("targets", [])
        if not targets or not all(t.get("expr") for t in targets):
            problems.append(f"{name}: needs targets, each with an expr")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs):
            problems.append(f"{name}: refIds repeat")
        for t in targets:
            for var in re.findall(r"\$\{?(\w+)", t.get("expr", "")):
                if not var.startswith("__") and var not in variables:
                    problems.append(f"{name}: ${var} is not a dashboard variable")
        if p.get("type") == "heatmap" and any("_bucket" in t.get("expr", "") for t in targets):
            heatmap_rows.add(current_row)

    at = 0
    for want in want_rows:
        try:
            at = rows.index(want, at) + 1
        except ValueError:
            problems.append(f"no row {want!r} (in order) among {rows}")
    if "Latency" in want_rows and "Latency" not in heatmap_rows:
        problems.append("the Latency row has no heatmap of a _bucket series")
    return problems


def self_test(dash, want_rows):
    """The breakages the lint must catch: (what, how to break a copy)."""
    def first(kind):
        return lambda d: next(p for p in d["panels"] if p.get("type") == kind)

    data = first("timeseries")
    breakages = [
        ("no unit", lambda d: data(d)["fieldConfig"]["defaults"].pop("unit")),
        ("no description", lambda d: data(d).pop("description")),
        ("no title", lambda d: data(d).update(title="")),
        ("no expr", lambda d: data(d)["targets"][0].update(expr="")),
        ("unknown variable", lambda d: data(d)["targets"][0].update(expr="up{job=\"$nope\"}")),
        ("duplicate id", lambda d: data(d).update(id=d["panels"][0]["id"])),
        ("overlap", lambda d: data(d).update(gridPos=dict(d["panels"][1]["gridPos"]))),
        ("missing row", lambda d: first("row")(d).update(title="Elsewhere")),
        ("no heatmap", lambda d: first("heatmap")(d).update(type="timeseries")),
        ("fixed data source", lambda d: data(d).update(datasource={"uid": "prom"})),
    ]
    failures = []
    if lint(dash, want_rows):
        failures.append("the original dashboard is not clean")
    for what, breakage in breakages:
        broken = json.loads(json.dumps(dash))
        breakage(broken)
        if not lint(broken, want_rows):
            failures.append(f"{what}: not reported")
    for f in failures:
        print(f"self-test: {f}")
    print(f"self-test: {len(breakages) - len(failures)} of {len(breakages)} breakages caught")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dashboard")
    parser.add_argument("--self-test", action="store_true",
                        help="check that the lint catches a broken copy of the dashboard")
    parser.add_argument("--rows", default=DEFAULT_ROWS,
                        help=f"row titles expected in order (default {DEFAULT_ROWS})")
    args = parser.parse_args()
    try:
        with open(args.dashboard, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"{args.dashboard}: {e}")
        return 1
    want_rows = [r for r in args.rows.split(",") if r]
    if args.self_test:
        return self_test(dash, want_rows)
    problems = lint(dash, want_rows)
    for p in problems:
        print(f"{args.dashboard}: {p}")
    if not problems:
        print(f"{args.dashboard}: {sum(1 for _ in dash['panels'])} panels, clean")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

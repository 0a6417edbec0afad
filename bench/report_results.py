"""What crew_bench's results hold, for report.py: the implementations and
workloads in table order, their notes, the same-run targets, the defaults of
crew_bench's options, and reading and sorting the JSON.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "bench"

IMPLS = ["crew", "crew_unbounded", "crew_fifo", "crew_priority", "crew_overload",
         "crew_metrics", "crew_null_observer", "crew_task", "tbb_enqueue", "tbb_task_group",
         "tbb_parallel_for", "asio", "thread_pool_deb", "polling_thread"]
LATENCY_ONLY = {"polling_thread"}  # a reference, not a pool
FORK_JOIN = ["fib", "skynet", "nqueens", "matmul"]
WORKLOADS = ["short_detached", "short_future", "producers_4", "factorial", "long_deadline",
             "queue_deadline", "group_wait", "funcpool_invoke", "parallel_for", "three_pools", "one_pool"] + FORK_JOIN
EXTRAS = {"idle_cpu", "queued_memory", "post_allocs", "shutdown_hard", "shutdown_soft",
          "metrics_scrape", "latency", "latency_max_rate", "cpu_gaps"}
DEFAULT_TASKS, DEFAULT_ROUNDS = 1_000_000, 9
DEFAULT_FJ_SIZES = {"fib": 30, "skynet": 6, "nqueens": 11, "matmul": 1024}
DEFAULT_LATENCY_SECONDS = 2

WORKLOAD_NOTES = {
    "short_detached": "1 producer, fire-and-forget, task = one atomic add",
    "short_future": "as short_detached with a result handle per task, then get() on all",
    "producers_4": "4 producer threads, fire-and-forget",
    "factorial": "task = factorial(20) in uint64_t added to an atomic",
    "long_deadline": "crew long tasks (std::stop_token) with a 1 s deadline, none expiring",
    "queue_deadline": "short_detached with a 1 s queue deadline (TaskOptions::queue_timeout) "
                      "per task, none expiring",
    "group_wait": "short tasks submitted into a crew::Group, then one wait()",
    "funcpool_invoke": "crew::FuncPool<uint64_t>::invoke, handler = short_detached's task body",
    "parallel_for": "10 x tasks indices (10,000,000 by default), body p[i] = i on a uint32 "
                    "array; figures are per index",
    "three_pools": "three crew pools (2 workers each) in one process, one producer thread "
                   "each posting short_detached's task",
    "one_pool": "the same tasks from three producer threads into one crew pool",
}

FORK_JOIN_NOTES = {
    "fib": "binary recursion, one task per call",
    "skynet": "10-way fan-out to depth d, leaves return their index, sum checked",
    "nqueens": "one task per legal placement of the next queen, solutions counted",
    "matmul": "N x N doubles split 4 ways down to 32 x 32 blocks, two phases per node, "
              "result checked",
}

# Same-run targets: (label, workload, impl, reference workload, reference impl,
# bound on the median of the per-round ratios).
TARGETS = [
    ("group_wait / short_future (crew)", "group_wait", "crew", "short_future", "crew", 1.3),
    ("funcpool_invoke / short_detached (crew)", "funcpool_invoke", "crew", "short_detached",
     "crew", 1.0),
    ("crew parallel_for / tbb_parallel_for", "parallel_for", "crew", "parallel_for",
     "tbb_parallel_for", 1.2),
    ("short_detached with the Prometheus exporter / without (crew_metrics / crew)",
     "short_detached", "crew_metrics", "short_detached", "crew", 1.25),
] + [
    (f"{w}: crew (default queue) / crew_unbounded", w, "crew", w, "crew_unbounded", 1.2)
    for w in ("short_detached", "short_future", "factorial", "producers_4")
] + [
    (f"{w}: crew / tbb_enqueue", w, "crew", w, "tbb_enqueue", 0.5)
    for w in ("short_detached", "short_future", "factorial", "producers_4")
] + [
    ("three_pools / one_pool, time for the same work (≤ 1.25: three pools keep ≥ 0.8x "
     "the throughput)", "three_pools", "crew", "one_pool", "crew", 1.25),
] + [
    target
    for w in FORK_JOIN
    for target in ((f"{w}: crew (Group) / tbb_task_group", w, "crew", w, "tbb_task_group", 1.0),
                   (f"{w}: crew_task / tbb_task_group", w, "crew_task", w, "tbb_task_group",
                    1.0))
]


def load(path):
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list):
        sys.exit(f"report.py: {path}: expected a JSON array")
    # Counts may be written as JSON numbers with a fraction (1000000.0).
    for e in entries:
        for key in ("tasks", "rounds"):
            if isinstance(e.get(key), float) and e[key].is_integer():
                e[key] = int(e[key])
    return entries


def order_key(entry):
    workload, impl = entry["workload"], entry["impl"]
    w = WORKLOADS.index(workload) if workload in WORKLOADS else len(WORKLOADS)
    i = IMPLS.index(impl) if impl in IMPLS else len(IMPLS)
    return (w, i, workload, impl)


def split(entries):
    """(flat throughput rows, fork-join rows, skipped rows, crew-only extras), each in
    table order. Fork-join rows whose every run failed have no ns_per_task."""
    rows = [e for e in entries if e["workload"] not in EXTRAS and "ns_per_task" in e
            and e["workload"] not in FORK_JOIN]
    fork_join = [e for e in entries if e["workload"] in FORK_JOIN and "skipped" not in e]
    skips = [e for e in entries if "skipped" in e]
    extras = [e for e in entries if e["workload"] in EXTRAS]
    return (sorted(rows, key=order_key), sorted(fork_join, key=order_key),
            sorted(skips, key=order_key), extras)


def latency_rows(entries):
    rows = [e for e in entries if e["workload"] == "latency"]
    return sorted(rows, key=lambda e: (e["rate"], IMPLS.index(e["impl"])
                                       if e["impl"] in IMPLS else len(IMPLS)))

"""A run's figures from loadgen's summary and the /metrics samples
(digest: goodput, latency, rejections by reason, the admission limit,
recovery), their medians over the rounds and the Markdown table of them.
"""
import statistics

# Reasons of a 503 decided at admission (from the request's head or at
# submission), not after the request waited in the queue.
ADMISSION_REASONS = {"limit", "deadline", "rate", "max_in_flight", "full", "closed", "too_many_blocked"}


def recovery_s(summary, window, slo_ms):
    """Seconds from the end of the overload until three seconds in a row
    answer at least 90 % of what they schedule with p99 within the SLO."""
    if window is None:
        return None
    secs = summary["per_second"]
    end = int(window[1])
    for i in range(end, len(secs) - 2):
        if all(s["p99_ms"] <= slo_ms and s["ok"] >= 0.9 * s["scheduled"]
               for s in secs[i:i + 3]):
            return i - end
    return None  # not within the run


def drop_recovery_s(summary, drop_at, new_mu):
    """W4: seconds from the drop until two seconds in a row have goodput of
    at least 0.9 of the capacity after it (new_mu)."""
    secs = summary["per_second"]
    start = int(drop_at)
    for i in range(start, len(secs) - 1):
        if all(s["goodput"] >= 0.9 * new_mu for s in secs[i:i + 2]):
            return i - start
    return None  # not within the run


def digest(summary, seconds, window, slo_ms, drop=None):
    rej = summary["rejection_latency_ms"]
    queue = [m["queue"] for m in summary.get("metrics", []) if m["queue"] is not None]
    limit = [m["limit"] for m in summary.get("metrics", []) if m["limit"] is not None]
    # The limit's coefficient of variation once settled (after 5 s).
    settled = [m["limit"] for m in summary.get("metrics", [])
               if m["limit"] is not None and m["t"] >= 5]
    limit_cv = (statistics.pstdev(settled) / statistics.mean(settled)
                if len(settled) >= 3 and statistics.mean(settled) > 0 else None)
    by_reason = summary["rejection_latency_by_reason_ms"]
    total_rej = sum(v["count"] for v in by_reason.values())
    at_admission = sum(v["count"] for k, v in by_reason.items()
                       if k.removeprefix("503 ") in ADMISSION_REASONS)
    return {
        "offered_per_s": summary["target_rate"],
        "goodput_per_s": summary["goodput"] / seconds,
        "ok_per_s": summary["status"].get("200", 0) / seconds,
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
        "p999_ms": summary["latency_ms"]["p99.9"],
        "rejected": sum(summary["rejections"].values()),
        "rejections": {k.removeprefix("503 "): {"count": v["count"], "p99_ms": v["p99"]}
                       for k, v in summary["rejection_latency_by_reason_ms"].items()},
        "rejection_p99_ms": rej["p99"] if rej["count"] else None,
        "errors": sum(summary["errors"].values()),
        "late_sends": summary["late_sends"],
        "send_lag_p99_ms": summary["send_lag_ms"]["p99"],
        "queue_max": max(queue) if queue else None,
        "limit_last": limit[-1] if limit else None,
        "limit_min": min(limit) if limit else None,
        "limit_cv": limit_cv,
        "admission_fraction": at_admission / total_rej if total_rej else None,
        "recovery_s": recovery_s(summary, window, slo_ms),
        # W4 (drop = (second of the drop, capacity after it)).
        "drop_recovery_s": drop_recovery_s(summary, *drop) if drop else None,
    }


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(results, mus):
    head = ("| workload | scenario | variant | offered/s | goodput/s | goodput/mu | p50 ms "
            "| p99 ms | p99.9 ms | rejected | rejection p99 ms | by reason: count (p99) | queue max "
            "| limit (min) | limit CV | at admission | recovery s |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for key, runs in results.items():
        wname, scen, variant = key
        d = [r for r in runs if "error" not in r]
        if not d:
            continue
        m = {k: median([r[k] for r in d]) for k in d[0] if k != "rejections"}
        reasons = {}
        for r in d:
            for k, v in r["rejections"].items():
                reasons.setdefault(k, []).append(v)
        reason_text = "; ".join(
            f"{k}: {median([x['count'] for x in v]):.0f} "
            f"(p99 {fmt(median([x['p99_ms'] for x in v]), 2)} ms)"
            for k, v in sorted(reasons.items())) or "–"
        lines.append(
            f"| {wname} | {scen} | {variant} | {fmt(m['offered_per_s'], 0)} "
            f"| {fmt(m['goodput_per_s'], 0)} | {fmt(m['goodput_per_s'] / mus[wname], 2)} "
            f"| {fmt(m['p50_ms'])} | {fmt(m['p99_ms'])} | {fmt(m['p999_ms'])} "
            f"| {fmt(m['rejected'], 0)} | {fmt(m['rejection_p99_ms'], 2)} | {reason_text} "
            f"| {fmt(m['queue_max'], 0)} | {fmt(m['limit_last'], 0)} ({fmt(m.get('limit_min'), 0)}) "
            f"| {fmt(m.get('limit_cv'), 2)} | {fmt(m.get('admission_fraction'), 2)} "
            f"| {fmt(m['recovery_s'] if m['recovery_s'] is not None else m.get('drop_recovery_s'), 0)} |")
    return "\n".join(lines)

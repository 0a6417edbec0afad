#!/usr/bin/env bash
# A/B comparison of two crew_bench binaries (say, a change against its base).
#
#   bench/ab.sh --before PATH/crew_bench --after PATH/crew_bench [--rounds N]
#               [--workloads w,...] [--impl NAME] [--out DIR] [--run-timeout S]
#               [-- extra crew_bench args]
#
#   --rounds N      rounds (default 9)
#   --workloads L   default short_detached,short_future,producers_4,factorial,
#                   group_wait,fib,skynet
#   --impl NAME     crew_bench implementation to compare (default crew)
#   --out DIR       keep each run's JSON in DIR (default: a temporary directory)
#   --run-timeout S a run still going after S seconds is killed and counts as
#                   failed (default 300)
#   -- ARGS         passed to every crew_bench run, after the defaults
#                   (--idle-seconds 0 --fj-stack 0), e.g. -- --tasks 200000
#
# Cross-core costs on this (virtual) machine drift 2-3x over minutes, so times
# from different minutes are never compared. Each round runs, per workload,
# the two binaries back to back (which goes first alternates by round), each
# as one `crew_bench --impl I --workload W --rounds 1 --json FILE` process;
# the figure is ns_per_task (bench/report.py's metric; fork-join: wall time x
# 2 threads / tasks). The table gives the median ns/task of each side, and
# the median, min and max of the per-round ratios after/before; "within
# 0.97-1.03" says whether the median ratio is in that band (below 1: after is
# faster). A run that fails counts as missing in its round. Always exits 0
# unless its own arguments are wrong: it is a measurement, not a test.
set -euo pipefail
exec python3 "$(dirname "$0")/ab.py" "$@"

#!/usr/bin/env bash
# Figures of crewd's jobs from a Redis stream (docs/distributed.md,
# "Figures"): throughput with 1, 2 and 3 instances, Redis calls and round
# trips per job, the effect of redis.batch (COUNT), and the recovery time of
# a killed instance's jobs. Runs the CrewdRedisFigures test and the kill test
# of service/tests/crewd_redis_test.cpp against redis-server on loopback.
#
#   bench/crewd_redis.sh [BUILD_DIR]      default: build (preset default)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
scripts/deps.sh test
[[ -f "$build/CMakeCache.txt" ]] || cmake --preset default
cmake --build "$build" -j2 --target crewd crewd_redis_test
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
CREWD_REDIS_FIGURES=1 "$build/service/tests/crewd_redis_test" \
  --gtest_filter='CrewdRedisFigures.*:CrewdRedis.ThreeInstances*' | grep -E '^\[ figures|FAILED'

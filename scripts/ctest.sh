#!/usr/bin/env bash
# ctest with the given arguments; when tests fail, each failed test's
# lines that say why (a gtest failure and the lines after it, a sanitizer's
# report header, RapidCheck's shrunk program and seed) are printed again
# at the very end, below ctest's summary, so that a log read from its tail
# shows them. The full output stays in BUILD_DIR/Testing/Temporary/LastTest.log.
#
#   scripts/ctest.sh BUILD_DIR [ctest arguments ...]
set -uo pipefail

build_dir=$1
shift
# Made before ctest starts: the logs of this run are newer. Then each failed
# test's output, one at a time.
stamp=$(mktemp)
out=$(mktemp)
trap 'rm -f "$stamp" "$out"' EXIT
ctest "$@"
rc=$?
[ "$rc" -eq 0 ] && exit 0

failed="$build_dir/Testing/Temporary/LastTestsFailed.log"
log="$build_dir/Testing/Temporary/LastTest.log"
# Written by this run, not left by an earlier one: a ctest that stopped
# before running tests writes neither.
[ "$failed" -nt "$stamp" ] && [ "$log" -nt "$stamp" ] || exit "$rc"

printf '\n==== why the failed tests failed (whole output: %s) ====\n' "$log"
# LastTestsFailed.log: "NUMBER:NAME" a line. In LastTest.log a test's output
# runs from its "N/M Testing: NAME" line to the next "Test Passed." or
# "Test Failed." line.
cut -d: -f2- "$failed" | head -n 3 | while IFS= read -r name; do
  printf -- '-- %s\n' "$name"
  awk -v name="$name" '
    $0 ~ "Testing: " && substr($0, length($0) - length(name) + 1) == name { on = 1; next }
    on && /^Test (Passed|Failed)\.|^"[^"]*" end time/ { on = 0 }
    on { print }
  ' "$log" >"$out"
  # From the first line that says why, 30 lines; then the lines that
  # reproduce a random program's failure (the model tests), last so that
  # they stand at the very end.
  first=$(grep -n -m1 -E 'Failure$|Falsifiable|ThreadSanitizer|AddressSanitizer|runtime error|terminate called|Aborted|did not return' "$out" | cut -d: -f1)
  if [ -n "$first" ]; then
    sed -n "${first},$((first + 29))p" "$out" | grep -v 'RC_PARAMS=' | cut -c1-400
  else
    tail -n 15 "$out" | cut -c1-400
  fi
  grep -E '^failed: |RC_PARAMS=' "$out" | head -n 4 | cut -c1-4000
done
exit "$rc"

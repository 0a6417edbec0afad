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
  # From the first line that says why: a gtest failure and 30 lines, or a
  # RapidCheck failure (the model tests) in three parts, the one that says
  # why last, so that a log read from its tail shows it: the shrunk program
  # (up to 45 lines), the line that reproduces it, then the check that
  # failed, from its "file:line:" line to the second blank line after it
  # (up to 60 lines; the model tests add the program's tasks as they saw
  # them).
  first=$(grep -n -m1 -E 'Failure$|Falsifiable|ThreadSanitizer|AddressSanitizer|runtime error|terminate called|Aborted|did not return' "$out" | cut -d: -f1)
  if [ -z "$first" ]; then
    tail -n 15 "$out" | cut -c1-400
  elif ! sed -n "${first},\$p" "$out" | grep -q '^Falsifiable'; then
    sed -n "${first},$((first + 29))p" "$out" | cut -c1-400
  else
    sed -n "${first},\$p" "$out" | awk '
      /RC_PARAMS=/ { rc = rc $0 "\n"; next }
      !why && seen && /^[^ ]+:[0-9]+:$/ { why = 1 }
      /^Falsifiable/ { seen = 1 }
      why && /^$/ { blanks++ }
      why && blanks < 2 && n_why++ < 60 { msg = msg $0 "\n" }
      !why && n_pre++ < 45 { print }
      END { printf "%s%s", rc, msg }' | cut -c1-4000
  fi
done
exit "$rc"

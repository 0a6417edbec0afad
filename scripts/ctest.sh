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
ctest "$@"
rc=$?
[ "$rc" -eq 0 ] && exit 0

failed="$build_dir/Testing/Temporary/LastTestsFailed.log"
log="$build_dir/Testing/Temporary/LastTest.log"
[ -f "$failed" ] && [ -f "$log" ] || exit "$rc"

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
  ' "$log" |
    grep -E -A6 'Failure$|Falsifiable|ThreadSanitizer|AddressSanitizer|runtime error|SUMMARY|did not return|terminate|Aborted|Timeout' |
    grep -v '^--$' | cut -c1-220 | head -n 24
done
exit "$rc"

#!/usr/bin/env bash
# Prints tests/support/test_costs.txt from the times ctest recorded in the
# given build directories (Testing/Temporary/CTestCostData.txt): each test
# that took at least a second in one of them, with its longest time, the
# longest first. A fresh build directory starts from that file
# (tests/CMakeLists.txt), so that ctest -j starts the long tests first.
#
#   scripts/test_costs.sh build build-tsan build-asan > tests/support/test_costs.txt
set -euo pipefail
(($# > 0)) || { echo "usage: scripts/test_costs.sh BUILD_DIR..." >&2; exit 2; }
for dir in "$@"; do
  # name runs average; a name holds no space, except gtest's "# GetParam()"
  # comment after parameterised names, which no long test has.
  sed '/^---$/,$d' "$dir/Testing/Temporary/CTestCostData.txt" | awk 'NF == 3 { print $1, $3 }'
done | awk '$2 >= 1 { if ($2 > max[$1]) max[$1] = $2 } END { for (n in max) printf "%s 1 %.2f\n", n, max[n] }' |
  sort -k3,3 -rn -k1,1
echo ---

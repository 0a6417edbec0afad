#!/usr/bin/env bash
# Checks crew's layering where the include paths cannot (src/CMakeLists.txt
# gives each layer only its own folder and the ones under it):
#   1. no file outside src/engine and tests/engine includes a header of
#      src/engine (the engine is private, even to the other layers);
#   2. no file under src/ reaches another folder by a relative path
#      ("../engine/..."), which would step around the include paths;
#   3. only tests/engine links crew_engine_internal, the engine's headers
#      for its own tests.
# Usage: scripts/check_layers.sh [ROOT] (default: this checkout). Prints
# each violation as file:line and exits 1 if there is any.
# scripts/check_layers.sh --self-test: checks that the check passes on this
# checkout and fails on a copy with each kind of violation added.
set -euo pipefail
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${1:-}" == --self-test ]]; then
  "$self" "$checkout" >/dev/null
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  expect_failure() {  # <what> <file> <line to append>
    rm -rf "$tmp/tree" && mkdir "$tmp/tree"
    cp -r "$checkout/src" "$checkout/tests" "$checkout/include" "$tmp/tree/"
    echo "$3" >>"$tmp/tree/$2"
    if "$self" "$tmp/tree" 2>/dev/null; then
      echo "layering self-test: not caught: $1" >&2
      exit 1
    fi
  }
  expect_failure "an engine header in src/pool" src/pool/group.cpp '#include "pool_runtime.hpp"'
  expect_failure "an engine header in tests/pool" tests/pool/task_test.cpp '#include "timer_heap.hpp"'
  expect_failure "a relative include" src/app/signals.cpp '#include "../engine/pool_runtime.hpp"'
  expect_failure "crew_engine_internal outside tests/engine" tests/pool/CMakeLists.txt \
    'target_link_libraries(pool_test PRIVATE crew_engine_internal)'
  echo "layering self-test: ok"
  exit 0
fi

root="${1:-$checkout}"
cd "$root"

fail=0
report() { printf 'layering: %s\n' "$*" >&2; fail=1; }

engine_headers=()
for h in src/engine/*.hpp; do engine_headers+=("$(basename "$h")"); done
if ((${#engine_headers[@]} > 0)); then
  pattern="#include \"([^\"]*/)?($(IFS='|'; echo "${engine_headers[*]//./\\.}"))\""
  while IFS= read -r hit; do
    report "$hit: includes an engine header outside src/engine and tests/engine"
  done < <(grep -rnE "$pattern" --include='*.hpp' --include='*.cpp' --include='*.h' \
             include src tests service bench examples tools 2>/dev/null |
           grep -vE '^(src/engine|tests/engine)/' || true)
fi

while IFS= read -r hit; do
  report "$hit: a relative include steps around the layer's include path"
done < <(grep -rnE '#include "\.\./' src 2>/dev/null || true)

while IFS= read -r hit; do
  report "$hit: only tests/engine may link crew_engine_internal"
done < <(grep -rn 'crew_engine_internal' --include='CMakeLists.txt' . 2>/dev/null |
         grep -vE '^[^:]+:[0-9]+:[[:space:]]*#' |
         grep -vE '^\./(tests/CMakeLists\.txt|tests/engine/CMakeLists\.txt):' || true)

if ((fail)); then
  echo "layering: failed (src/CMakeLists.txt describes the layers)" >&2
  exit 1
fi
echo "layering: ok"

#!/usr/bin/env bash
# Runs crew's concurrency tests many times in a row, so that a race that
# fails one run in a hundred shows up before it reaches a user:
#
#   scripts/stress.sh [--since REF] [--tests NAME,NAME...]
#
# Every test case of the selected binaries runs RELEASE_REPEAT times
# (default 20) in the RelWithDebInfo build (build/), then TSAN_REPEAT times
# (default 3) under ThreadSanitizer (build-tsan/); a case stops at its first
# failure (ctest --repeat until-fail), and the script fails if any case did.
# The model tests (random programs: tests/pool/model_test.cpp,
# tests/coro/coro_model_test.cpp) are not repeated: each runs once with
# MODEL_RELEASE_PROGRAMS (default 20000) programs in build/ and
# MODEL_TSAN_PROGRAMS (default 2000) under TSan.
# Builds only the selected binaries. JOBS (default 2) sets -j for both.
#
# --since REF: only the binaries whose test files changed between the git
# ref REF and the working tree (tests/<layer>/<name>.cpp; tests/app/ counts for
# application_test); a change to tests/support/ or tests/CMakeLists.txt
# selects them all. Nothing selected: says so and succeeds.
# --tests LIST: exactly these binaries (comma-separated).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The binaries whose tests run threads against each other. Optional ones
# (metrics, Redis) are skipped when their target is not configured.
readonly concurrency_tests=(pool_test pool_admission_test pool_workers_test pool_lifetime_test
  wake_policy_test ring_test local_queue_test submission_test task_test shutdown_test group_test
  fork_join_test batch_test parallel_for_test func_pool_test sharded_pool_test pool_start_test
  priority_test pool_overload_test chaos_test timer_heap_test cpu_pressure_test application_test
  signals_test metrics_test stream_source_test coro_test coro_accounting_test coro_callback_test
  coro_suspension_test model_test coro_model_test)
readonly model_tests=(model_test coro_model_test)

release_repeat="${RELEASE_REPEAT:-20}"
tsan_repeat="${TSAN_REPEAT:-3}"
model_release_programs="${MODEL_RELEASE_PROGRAMS:-20000}"
model_tsan_programs="${MODEL_TSAN_PROGRAMS:-2000}"
jobs="${JOBS:-2}"
since=""
only=()

while (($#)); do
  case "$1" in
    --since) since="${2:?--since needs a git ref}"; shift 2 ;;
    --tests) IFS=',' read -r -a only <<<"${2:?--tests needs a list}"; shift 2 ;;
    -h | --help) sed -n '2,18s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "stress.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

selected=()
if ((${#only[@]} != 0)); then
  selected=("${only[@]}")
elif [[ -z "$since" ]]; then
  selected=("${concurrency_tests[@]}")
else
  git rev-parse --verify --quiet "$since^{commit}" >/dev/null ||
    { echo "stress.sh: '$since' is not a git ref here" >&2; exit 2; }
  changed="$(git diff --name-only "$since" -- tests/)"
  if grep -qxE 'tests/(support/.*|CMakeLists\.txt)' <<<"$changed"; then
    selected=("${concurrency_tests[@]}")
  else
    for t in "${concurrency_tests[@]}"; do
      if grep -qE "^tests/[a-z]+/$t\.cpp$" <<<"$changed" ||
        { [[ "$t" == application_test ]] && grep -q '^tests/app/' <<<"$changed"; }; then
        selected+=("$t")
      fi
    done
  fi
  if ((${#selected[@]} == 0)); then
    echo "stress: no concurrency test file changed since $since; nothing to run"
    exit 0
  fi
fi

run_preset() { # preset build-dir repeat model-programs
  local preset="$1" dir="$2" repeat="$3" programs="$4"
  bash scripts/configure.sh "$preset" >/dev/null
  local available present=()
  available="$(cmake --build "$dir" --target help)"
  for t in "${selected[@]}"; do
    # Ninja lists "name: phony"; the Makefiles generator "... name".
    if grep -qE "^(\.\.\. )?$t(: phony)?\$" <<<"$available"; then present+=("$t"); fi
  done
  if ((${#present[@]} == 0)); then
    echo "stress: none of ${selected[*]} is configured in $dir" >&2
    return 1
  fi
  cmake --build "$dir" -j "$jobs" --target "${present[@]}"
  local t0=$SECONDS repeated=() t
  local models=()
  for t in "${present[@]}"; do
    if [[ " ${model_tests[*]} " == *" $t "* ]]; then models+=("$t"); else repeated+=("$t"); fi
  done
  if ((${#repeated[@]} != 0)); then
    local labels
    labels="^($(
      IFS='|'
      echo "${repeated[*]}"
    ))\$"
    printf '\n==== stress (%s): %s, each case x%s ====\n' "$preset" "${repeated[*]}" "$repeat"
    # Every repetition prints a line; keep the failures, the progress lines of
    # each finished case and the summary.
    # scripts/ctest.sh: a failure's message again at the end.
    bash scripts/ctest.sh "$dir" --preset "$preset" -j "$jobs" -L "$labels" \
      --repeat "until-fail:$repeat" |
      grep -vE '^ +(Start +[0-9]+:|Test +#[0-9]+: .* Passed)'
  fi
  for t in "${models[@]}"; do
    # Longer than ctest's bound on a test: run directly, RapidCheck's
    # parameters from RC_PARAMS (a failure prints its seed and shrunk program).
    printf '\n==== stress (%s): %s, %s programs ====\n' "$preset" "$t" "$programs"
    RC_PARAMS="max_success=$programs${RC_PARAMS:+ $RC_PARAMS}" "$dir/tests/$t"
  done
  echo "stress ($preset): passed in $((SECONDS - t0)) s"
}

run_preset default build "$release_repeat" "$model_release_programs"
run_preset tsan build-tsan "$tsan_repeat" "$model_tsan_programs"

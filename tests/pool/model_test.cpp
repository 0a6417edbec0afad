// Random programs against a model of crew's contracts (tests/pool/pool_model.hpp
// says what a program does and what is checked after each of its steps).
//
// RapidCheck generates the programs and, when one fails, shrinks it to a
// minimal one, printed with the seed that reproduces it. The number of
// programs: RC_PARAMS="max_success=N" (and any other RapidCheck parameter,
// e.g. seed=S, max_size=L for longer programs) from the environment; without
// it, kPrograms. make stress runs more (scripts/stress.sh).
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <chrono>

#include "pool_model.hpp"
#include "random_programs.hpp"
#include "test_util.hpp"

namespace crew::test::model {
namespace {

// Programs per run of the test without RC_PARAMS: about a minute on two
// cores in each build (the sanitizers run each program ~5x slower).
constexpr int kPrograms = kSlowdown == 1 ? 1000 : 500;
// Commands per program at most (RapidCheck's size grows to this).
constexpr int kMaxSize = 30;

TEST(PoolModel, RandomProgramsKeepEveryContract) {
  // Each blocking call of a program is bounded by kBound; the watchdog
  // bounds the rest (generation, shrinking a failure).
  check_random_programs("PoolModel/RandomProgramsKeepEveryContract",
                        random_program_params(kPrograms, kMaxSize), std::chrono::seconds(60),
                        [] { run_program(); });
}

}  // namespace
}  // namespace crew::test::model

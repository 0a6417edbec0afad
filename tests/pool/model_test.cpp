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
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "pool_model.hpp"
#include "test_util.hpp"

namespace crew::test::model {
namespace {

// Programs per run of the test without RC_PARAMS: about a minute on two
// cores in each build (the sanitizers run each program ~5x slower).
constexpr int kPrograms = kSlowdown == 1 ? 1000 : 500;
// Commands per program at most (RapidCheck's size grows to this).
constexpr int kMaxSize = 30;

// The parameters: RC_PARAMS' where given, kPrograms and kMaxSize otherwise.
rc::detail::TestParams params() {
  rc::detail::TestParams p = rc::detail::configuration().testParams;
  const char* env = std::getenv("RC_PARAMS");
  const std::string given = env == nullptr ? "" : env;
  if (given.find("max_success") == std::string::npos) p.maxSuccess = kPrograms;
  if (given.find("max_size") == std::string::npos) p.maxSize = kMaxSize;
  return p;
}

TEST(PoolModel, RandomProgramsKeepEveryContract) {
  // Each blocking call of a program is bounded by kBound; this bounds the
  // rest (generation, shrinking a failure) so that ctest never hangs.
  const rc::detail::TestParams p = params();
  Watchdog dog(std::chrono::seconds(60 + p.maxSuccess / 5));
  rc::detail::TestMetadata meta;
  meta.id = "PoolModel/RandomProgramsKeepEveryContract";
  meta.description = "random programs";
  const auto t0 = std::chrono::steady_clock::now();
  const rc::detail::TestResult result = rc::detail::checkTestable([] { run_program(); }, meta, p);
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  if (result.template is<rc::detail::SuccessResult>()) {
    std::cout << os.str() << " in " << ms << " ms\n";
  } else {
    ADD_FAILURE() << os.str();
  }
}

}  // namespace
}  // namespace crew::test::model

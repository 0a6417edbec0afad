// Running a RapidCheck property as one gtest case, bounded: the model
// tests (tests/pool/model_test.cpp, tests/coro/coro_model_test.cpp).
//
// The number of programs: RC_PARAMS="max_success=N" from the environment
// (and any other RapidCheck parameter: seed=S, max_size=L, reproduce=...),
// else the test's own default. A failure is reported with RapidCheck's
// message: the shrunk program, and the seed or string that reproduces it.
// That string replays the first failing program and then the shrinking
// steps, each of which must fail again: a failure that depends on timing
// often reports "Reproduced result is not a failure" at the first step.
// Then write the printed program out as commands in a test of its own and
// run it many times (and under load): the message's task list says what
// each task did in the run that failed.
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>

#include "test_util.hpp"

namespace crew::test {

// RapidCheck's parameters: RC_PARAMS' where it sets them, else
// `programs` and (when not 0) `max_size`.
inline rc::detail::TestParams random_program_params(int programs, int max_size = 0) {
  rc::detail::TestParams p = rc::detail::configuration().testParams;
  const char* env = std::getenv("RC_PARAMS");
  const std::string given = env == nullptr ? "" : env;
  if (given.find("max_success") == std::string::npos) p.maxSuccess = programs;
  if (max_size != 0 && given.find("max_size") == std::string::npos) p.maxSize = max_size;
  return p;
}

// Checks `property` on random programs under a watchdog of `bound` plus
// a fifth of a second per program (generation, shrinking a failure);
// prints the count and time on success, fails the gtest case otherwise.
template <class Property>
void check_random_programs(const char* id, const rc::detail::TestParams& p,
                           std::chrono::seconds bound, Property property) {
  Watchdog dog(bound + std::chrono::seconds(p.maxSuccess / 5));
  rc::detail::TestMetadata meta;
  meta.id = id;
  meta.description = "random programs";
  const auto t0 = std::chrono::steady_clock::now();
  const rc::detail::TestResult result = rc::detail::checkTestable(std::move(property), meta, p);
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

}  // namespace crew::test

// service/tests/crewd_suite.hpp: GoogleTest fixtures over a crewd child
// process (crewd_harness.hpp): one crewd for a whole suite, and the check
// that a SIGTERM stops a crewd cleanly.
//
// Threads: the fixture's hooks run on GoogleTest's main thread; crewd is a
// separate process. Every wait is bounded.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "crewd_harness.hpp"

namespace crewd::test {

// Sends SIGTERM and expects crewd to exit 0 within 20 s (scaled by
// kSlowdown); the failure message carries its log.
inline void expect_clean_stop(Crewd& crewd) {
  crewd.signal(SIGTERM);
  const auto status = crewd.wait_exit(20s * kSlowdown);
  EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << crewd.log();
}

// One crewd for every test of the suite `Suite` derives it for
// (`class X : public SharedCrewd<X>`), started with Suite::args() before
// the first test and stopped with expect_clean_stop() after the last. Each
// test fails at once if crewd did not report its port.
template <class Suite>
class SharedCrewd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    crewd_ = std::make_unique<Crewd>(Suite::args());
    port_ = crewd_->wait_port();
  }
  static void TearDownTestSuite() {
    expect_clean_stop(*crewd_);
    crewd_.reset();
  }
  void SetUp() override { ASSERT_GT(port_, 0) << crewd_->log(); }

  static inline std::unique_ptr<Crewd> crewd_;
  static inline int port_ = 0;
};

}  // namespace crewd::test

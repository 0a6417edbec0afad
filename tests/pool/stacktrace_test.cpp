// Tests of crew::stacktrace (crew/stacktrace.hpp): this binary links it, so
// every throw in it records its stack, and a pool's report of an unhandled
// task exception ends with it. (pool_test, which does not link it, checks
// that the report then has no trace.)
#include "crew/stacktrace.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::Watchdog;

// Not inlined, so that it is a frame of its own whatever the optimizer does.
[[gnu::noinline]] void throw_from_the_ingest_step(int batch) {
  if (batch >= 0) throw std::runtime_error("batch " + std::to_string(batch) + ": disk full");
}

[[gnu::noinline]] void throw_from_the_cleanup_step() { throw std::logic_error("cleanup failed"); }

// The first frame of the trace in `err` (the line after " 0# "), or "".
std::string first_frame(const std::string& err) {
  const std::size_t at = err.find(" 0# ");
  if (at == std::string::npos) return "";
  return err.substr(at + 4, err.find('\n', at) - at - 4);
}

std::string report_of(std::function<void()> task, const std::string& name) {
  testing::internal::CaptureStderr();
  {
    Pool pool({.name = "traced"});
    EXPECT_EQ(pool.post(std::move(task), {.name = name}), Admission::accepted);
    EXPECT_TRUE(pool.wait_idle(10s));
  }
  return testing::internal::GetCapturedStderr();
}

TEST(StackTrace, TheReportNamesTheTaskAndTheThrowingFunction) {
  Watchdog dog;
  const std::string err = report_of([] { throw_from_the_ingest_step(7); }, "ingest-7");
  // One log line (one write), then the frames: the name, the message, and
  // the throwing function as the first frame, with its file.
  EXPECT_NE(err.find("crew error pool=traced task=ingest-7#"), std::string::npos) << err;
  EXPECT_NE(err.find("task threw: batch 7: disk full; thrown at:\n"), std::string::npos) << err;
  // (The name's form depends on the debug info: qualified with its
  // parameters, or, with -gline-tables-only, the bare name.)
  EXPECT_NE(first_frame(err).find("throw_from_the_ingest_step"), std::string::npos) << err;
  EXPECT_NE(first_frame(err).find("stacktrace_test.cpp:"), std::string::npos) << err;
}

// Only the last throw of the thread is kept: an exception caught inside the
// task and replaced by another shows the other's stack.
TEST(StackTrace, ACaughtExceptionReplacedByAnotherShowsTheOthersStack) {
  Watchdog dog;
  const std::string err = report_of(
      [] {
        try {
          throw_from_the_ingest_step(1);
        } catch (const std::runtime_error&) {
          throw_from_the_cleanup_step();
        }
      },
      "cleanup");
  EXPECT_NE(err.find("task=cleanup#"), std::string::npos) << err;
  EXPECT_NE(first_frame(err).find("throw_from_the_cleanup_step"), std::string::npos) << err;
  EXPECT_EQ(err.find("throw_from_the_ingest_step"), std::string::npos) << err;
}

// throw_trace() shows the stack only for the exception thrown last on the
// calling thread: never a stack that belongs to another exception.
TEST(StackTrace, ThrowTraceIsEmptyForAnExceptionThrownElsewhere) {
  Watchdog dog;
  std::exception_ptr other_thread;
  std::thread([&other_thread] {
    try {
      throw_from_the_ingest_step(2);
    } catch (...) {
      other_thread = std::current_exception();
    }
  }).join();
  EXPECT_EQ(throw_trace(other_thread), "");
  try {
    throw_from_the_cleanup_step();
  } catch (...) {
    const std::exception_ptr here = std::current_exception();
    EXPECT_NE(throw_trace(here).find("throw_from_the_cleanup_step"), std::string::npos);
    EXPECT_EQ(throw_trace(other_thread), "");
  }
  EXPECT_EQ(throw_trace(std::make_exception_ptr(std::runtime_error("never thrown"))), "");
  EXPECT_EQ(throw_trace(nullptr), "");
}

}  // namespace
}  // namespace crew

// The exporter's whole exposition checked by promtool (Debian package
// prometheus) after a workload of two pools with awkward task names, and
// prometheus-cpp's own serializer on the same families: what a Prometheus
// server would scrape. Skipped, with the reason, where promtool was not
// found at configure time. The writer on hand-built families:
// text_exposition_test.cpp; the exporter's counts: metrics_test.cpp.
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "crew/metrics.hpp"
#include "crew/pool.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::Watchdog;

PoolOptions observed(PrometheusMetrics& metrics, std::string name, PoolOptions o = {}) {
  o.name = std::move(name);
  o.observers.push_back(metrics.observer(o.name));
  return o;
}

#ifdef CREW_PROMTOOL
std::string run_promtool(const std::string& exposition, int* status) {
  char path[] = "/tmp/crew_metrics_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  close(fd);
  std::ofstream(path) << exposition;
  const std::string command = std::string(CREW_PROMTOOL) + " check metrics < " + path + " 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed");
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  const int rc = pclose(pipe);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::remove(path);
  return output;
}
#endif

TEST(PrometheusExposition, PromtoolFindsNoProblemsAfterAWorkload) {
#ifndef CREW_PROMTOOL
  GTEST_SKIP() << "promtool not found at configure time (Debian package prometheus; "
                  "scripts/deps.sh test installs it)";
#else
  Watchdog dog(60s);
  PrometheusMetrics metrics({.max_task_names = 4});
  {
    Pool alpha(observed(metrics, "alpha", {.max_workers = 2}));
    Pool beta(observed(metrics, "beta", {.max_workers = 1, .queue_capacity = 4}));
    metrics.watch(alpha);
    metrics.watch(beta);
    const std::vector<std::string> names = {
        "resize",  "say \"hi\"", "back\\slash", "new\nline", std::string("bad\xff utf8"),
        "ünïcödé", "n6",         "n7"};
    for (int i = 0; i < 200; ++i) {
      const std::string& name = names[static_cast<std::size_t>(i) % names.size()];
      ASSERT_EQ(alpha.post([] {}, {.name = name}), Admission::accepted);
      (void)beta.try_post([] { std::this_thread::sleep_for(50us); }, {.name = name});
    }
    ASSERT_EQ(alpha.post([] { throw std::runtime_error("expected"); }, {.name = "resize"}),
              Admission::accepted);
    ASSERT_EQ(alpha.post([] {}), Admission::accepted);
    ASSERT_TRUE(alpha.wait_idle(10s));
    ASSERT_TRUE(beta.wait_idle(10s));

    const auto families = metrics.Collect();
    const std::string text = text_exposition(families);
    int status = -1;
    const std::string problems = run_promtool(text, &status);
    EXPECT_EQ(status, 0) << problems << "\n--- exposition ---\n" << text;
    EXPECT_EQ(problems, "") << "\n--- exposition ---\n" << text;
    // prometheus-cpp's own serializer (what its Exposer serves) passes too.
    const std::string theirs = prometheus::TextSerializer().Serialize(families);
    EXPECT_EQ(run_promtool(theirs, &status), "") << theirs;
    EXPECT_EQ(status, 0);
    // Every family has HELP and TYPE once, whatever the number of pools.
    for (const char* f : {"crew_workers", "crew_tasks_total", "crew_task_duration_seconds"}) {
      const std::string type = std::string("# TYPE ") + f + " ";
      const auto first = text.find(type);
      EXPECT_NE(first, std::string::npos) << f;
      EXPECT_EQ(text.find(type, first + 1), std::string::npos) << f;
    }
    EXPECT_NE(text.find("crew_tasks_total{pool=\"alpha\",task=\"other\",outcome=\"succeeded\"}"),
              std::string::npos)
        << text;
  }
  // After the pools are gone the exposition still passes.
  int status = -1;
  const std::string text = text_exposition(metrics.Collect());
  EXPECT_EQ(run_promtool(text, &status), "");
  EXPECT_EQ(status, 0);
#endif
}

}  // namespace
}  // namespace crew

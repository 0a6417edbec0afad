// Tests of the crewctl command against a redis-server on a free port.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "redis_server.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using test::RedisServer;
using test::Watchdog;

struct CrewctlRun {
  int status = -1;
  std::string out;
};

CrewctlRun crewctl(const RedisServer& redis, const std::string& args) {
  const std::string cmd = std::string(CREW_CREWCTL) +
                          " --redis 127.0.0.1:" + std::to_string(redis.port()) + " " + args +
                          " 2>&1";
  CrewctlRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) r.out += buf;
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(Crewctl, EnqueuesJobsWithTheHttpApisFields) {
  Watchdog dog;
  RedisServer redis;
  const CrewctlRun r =
      crewctl(redis, "enqueue --kind sleep --ms 5 --timeout-ms 100 --name nightly --count 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(redis.command({"XLEN", "crew:jobs"}), "3");
  redisReply* e = redis.raw({"XRANGE", "crew:jobs", "-", "+", "COUNT", "1"});
  ASSERT_NE(e, nullptr);
  std::string fields;
  const redisReply* kv = e->element[0]->element[1];
  for (std::size_t k = 0; k < kv->elements; ++k) fields += std::string(kv->element[k]->str) + " ";
  freeReplyObject(e);
  EXPECT_EQ(fields, "kind sleep ms 5 timeout_ms 100 name nightly ");
}

TEST(Crewctl, PrintsResultsDeadLettersAndStatus) {
  Watchdog dog;
  RedisServer redis;
  redis.command({"XADD", "crew:results", "*", "job", "1-0", "attempt", "1", "status", "ok"});
  redis.command({"XADD", "crew:dead", "*", "job", "2-0", "attempt", "3", "error", "boom"});
  redis.command({"XGROUP", "CREATE", "crew:jobs", "crew", "0", "MKSTREAM"});
  const CrewctlRun results = crewctl(redis, "results");
  EXPECT_EQ(results.status, 0);
  EXPECT_NE(results.out.find("job=1-0 attempt=1 status=ok"), std::string::npos) << results.out;
  const CrewctlRun dead = crewctl(redis, "dead --count 0");
  EXPECT_NE(dead.out.find("job=2-0 attempt=3 error=boom"), std::string::npos) << dead.out;
  const CrewctlRun status = crewctl(redis, "status");
  EXPECT_EQ(status.status, 0) << status.out;
  EXPECT_NE(status.out.find("results crew:results: 1 entries"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("group name=crew"), std::string::npos) << status.out;
}

TEST(Crewctl, BadArgumentsAndAnUnreachableRedisAreDistinctErrors) {
  Watchdog dog;
  RedisServer redis;
  EXPECT_EQ(crewctl(redis, "enqueue --kind dance --ms 1").status, 2);
  EXPECT_EQ(crewctl(redis, "enqueue --kind sleep").status, 2);
  redis.stop();
  EXPECT_EQ(crewctl(redis, "status").status, 1);
}

}  // namespace
}  // namespace crew

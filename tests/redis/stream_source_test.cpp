// Tests of crew::StreamSource against a real redis-server on loopback: each
// job is run and acknowledged after its outcome is written, backpressure,
// retries and the dead-letter stream, recovery of a dead consumer's jobs,
// a graceful stop, and a Redis restart.
#include "crew/stream_source.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "crew/pool.hpp"
#include "redis_server.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::Gate;
using test::RedisServer;
using test::Watchdog;

std::vector<std::string> enqueue(RedisServer& redis, int n, const std::string& kind = "ok") {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(redis.command({"XADD", "crew:jobs", "*", "kind", kind, "n", std::to_string(i)}));
  }
  return ids;
}

struct Outcome {
  std::string job, status, value;
  int attempt = 0;
};

// Every entry of a results (or dead-letter) stream.
std::vector<Outcome> read_stream(RedisServer& redis, const std::string& stream) {
  std::vector<Outcome> out;
  redisReply* r = redis.raw({"XRANGE", stream, "-", "+"});
  if (r == nullptr) return out;
  for (std::size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; ++i) {
    const redisReply* kv = r->element[i]->element[1];
    Outcome o;
    for (std::size_t k = 0; k + 1 < kv->elements; k += 2) {
      const std::string key(kv->element[k]->str, kv->element[k]->len);
      const std::string val(kv->element[k + 1]->str, kv->element[k + 1]->len);
      if (key == "job") o.job = val;
      if (key == "status") o.status = val;
      if (key == "attempt") o.attempt = std::stoi(val);
      if (key == "result" || key == "error") o.value = val;
    }
    out.push_back(o);
  }
  freeReplyObject(r);
  return out;
}

long pending(RedisServer& redis) {
  redisReply* r = redis.raw({"XPENDING", "crew:jobs", "crew"});
  long n = -1;
  if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements > 0) n = r->element[0]->integer;
  if (r != nullptr) freeReplyObject(r);
  return n;
}

StreamSourceOptions options_for(const RedisServer& redis, std::string consumer) {
  return {.port = redis.port(),
          .consumer = std::move(consumer),
          .block = 50ms,
          .claim_idle = 300ms,
          .retry_backoff = 10ms,
          .reconnect_min = 20ms,
          .reconnect_max = 200ms};
}

JobResult echo(const Job& job, std::stop_token) { return {true, "done " + job.field("n")}; }

// Consumer "a" takes the stream's first `n` entries and dies holding them: its
// pool shuts down hard, which stops the jobs, so none is acknowledged and all
// stay pending for another consumer to claim.
void orphan(RedisServer& redis, int n) {
  Pool doomed({.max_workers = static_cast<std::size_t>(n), .shutdown_mode = ShutdownMode::hard});
  std::atomic<int> started{0};
  StreamSource a(doomed, options_for(redis, "a"), [&](const Job&, std::stop_token stop) {
    started.fetch_add(1);
    while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
    return JobResult{true, "never written"};
  });
  a.start();
  ASSERT_TRUE(eventually([&] { return started.load() == n; }));
  a.stop();
}

TEST(StreamSource, RunsEveryJobOnceAndAcknowledgesItAfterItsResult) {
  Watchdog dog;
  RedisServer redis;
  const auto ids = enqueue(redis, 200);
  Pool pool({.max_workers = 4});
  StreamSource source(pool, options_for(redis, "a"), echo);
  source.start();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == 200; }, 20s));
  ASSERT_TRUE(source.wait_idle(10s));
  const auto results = read_stream(redis, "crew:results");
  std::set<std::string> seen;
  for (const Outcome& o : results) {
    EXPECT_EQ(o.status, "ok");
    EXPECT_EQ(o.attempt, 1);
    EXPECT_TRUE(seen.insert(o.job).second) << "duplicate result for " << o.job;
  }
  EXPECT_EQ(seen, std::set<std::string>(ids.begin(), ids.end()));
  EXPECT_EQ(pending(redis), 0);
  const StreamSourceStats s = source.stats();
  EXPECT_TRUE(s.connected);
  EXPECT_EQ(s.read, 200u);
  EXPECT_EQ(s.succeeded, 200u);
}

TEST(StreamSource, NeverTakesMoreThanItHasRoomFor) {
  Watchdog dog;
  RedisServer redis;
  enqueue(redis, 20);
  Pool pool({.max_workers = 8});
  Gate gate;
  std::atomic<int> running{0}, most{0};
  auto opts = options_for(redis, "a");
  opts.max_in_flight = 3;
  StreamSource source(pool, opts, [&](const Job& job, std::stop_token) {
    const int now = running.fetch_add(1) + 1;
    int prev = most.load();
    while (now > prev && !most.compare_exchange_weak(prev, now)) {
    }
    gate.wait();
    running.fetch_sub(1);
    return JobResult{true, job.id};
  });
  source.start();
  ASSERT_TRUE(eventually([&] { return running.load() == 3; }));
  std::this_thread::sleep_for(150ms);  // several read rounds
  EXPECT_EQ(source.stats().in_flight, 3u);
  EXPECT_EQ(pending(redis), 3) << "only what it can run is taken from the stream";
  gate.open();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == 20; }, 20s));
  EXPECT_LE(most.load(), 3);
}

// A job that runs for over three times claim_idle on a live consumer is not
// claimed again, by that consumer or by a second one claiming beside it:
// the first keeps its entry's idle time under claim_idle.
TEST(StreamSource, AJobRunningLongerThanClaimIdleIsNotClaimedAgain) {
  Watchdog dog;
  RedisServer redis;
  enqueue(redis, 1);
  std::atomic<int> runs{0};
  Gate gate;
  auto handler = [&](const Job& job, std::stop_token) {
    runs.fetch_add(1);
    gate.wait();
    return JobResult{true, job.id};
  };
  auto opts_a = options_for(redis, "a");
  opts_a.claim_idle = 600ms;
  Pool pool_a({.max_workers = 2});
  StreamSource a(pool_a, opts_a, handler);
  a.start();
  ASSERT_TRUE(eventually([&] { return runs.load() == 1; }));
  auto opts_b = options_for(redis, "b");
  opts_b.claim_idle = 600ms;
  Pool pool_b({.max_workers = 2});
  StreamSource b(pool_b, opts_b, handler);
  b.start();
  std::this_thread::sleep_for(2s);  // about 13 claim rounds of each consumer
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(a.stats().claimed + b.stats().claimed, 0u);
  EXPECT_EQ(a.stats().in_flight, 1u);
  gate.open();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == 1; }));
  ASSERT_TRUE(a.wait_idle(10s));
  EXPECT_EQ(pending(redis), 0);
  EXPECT_EQ(read_stream(redis, "crew:results").at(0).attempt, 1);
  EXPECT_EQ(runs.load(), 1);
}

TEST(StreamSource, AFailingJobIsRetriedThenDeadLettered) {
  Watchdog dog;
  RedisServer redis;
  enqueue(redis, 1, "always-fails");
  enqueue(redis, 1, "fails-once");
  Pool pool({.max_workers = 2});
  std::atomic<int> calls_once{0};
  StreamSource source(pool, options_for(redis, "a"), [&](const Job& job, std::stop_token) {
    if (job.field("kind") == "always-fails") throw std::runtime_error("bad input");
    if (calls_once.fetch_add(1) == 0) return JobResult{false, "flaky"};
    return JobResult{true, "fine"};
  });
  source.start();
  ASSERT_TRUE(eventually([&] {
    return read_stream(redis, "crew:dead").size() == 1 &&
           read_stream(redis, "crew:results").size() == 1;
  }));
  const Outcome dead = read_stream(redis, "crew:dead").at(0);
  EXPECT_EQ(dead.status, "dead");
  EXPECT_EQ(dead.value, "bad input");
  EXPECT_EQ(dead.attempt, 3);
  const Outcome ok = read_stream(redis, "crew:results").at(0);
  EXPECT_EQ(ok.attempt, 2);
  EXPECT_EQ(ok.value, "fine");
  ASSERT_TRUE(source.wait_idle(10s));
  EXPECT_EQ(pending(redis), 0);
  EXPECT_EQ(source.stats().retried, 3u);  // 2 for the dead one, 1 for the flaky one
  EXPECT_EQ(source.stats().dead_lettered, 1u);
}

// Every key of each entry of a stream, in order.
std::vector<std::vector<std::string>> keys_of(RedisServer& redis, const std::string& stream) {
  std::vector<std::vector<std::string>> out;
  redisReply* r = redis.raw({"XRANGE", stream, "-", "+"});
  if (r == nullptr) return out;
  for (std::size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; ++i) {
    const redisReply* kv = r->element[i]->element[1];
    auto& keys = out.emplace_back();
    for (std::size_t k = 0; k + 1 < kv->elements; k += 2) {
      keys.emplace_back(kv->element[k]->str, kv->element[k]->len);
    }
  }
  freeReplyObject(r);
  return out;
}

// With the default limits (1 MiB, 1024 fields): an entry over either is
// dead-lettered at once, unrun, without its fields; the next entry runs.
TEST(StreamSource, AnEntryOverTheSizeLimitsIsDeadLetteredUnrun) {
  Watchdog dog;
  RedisServer redis;
  const std::string big = redis.command(
      {"XADD", "crew:jobs", "*", "kind", "big", "pad", std::string((1 << 20) + 1, 'x')});
  std::vector<std::string> wide = {"XADD", "crew:jobs", "*", "kind", "wide"};
  for (int i = 0; i < 1024; ++i) {
    wide.push_back("f" + std::to_string(i));
    wide.emplace_back("v");
  }
  const std::string many = redis.command(wide);  // 1025 fields
  const std::vector<std::string> fine = enqueue(redis, 1);
  Pool pool({.max_workers = 2});
  std::atomic<int> ran{0};
  std::atomic<int> ran_oversized{0};
  StreamSource source(pool, options_for(redis, "a"), [&](const Job& job, std::stop_token stop) {
    ++ran;
    if (job.field("kind") != "ok") ++ran_oversized;
    return echo(job, stop);
  });
  source.start();
  ASSERT_TRUE(eventually([&] {
    return read_stream(redis, "crew:dead").size() == 2 &&
           read_stream(redis, "crew:results").size() == 1;
  }));
  ASSERT_TRUE(source.wait_idle(10s));
  std::map<std::string, Outcome> dead;
  for (const Outcome& o : read_stream(redis, "crew:dead")) dead[o.job] = o;
  ASSERT_TRUE(dead.contains(big) && dead.contains(many));
  EXPECT_EQ(dead[big].status, "dead");
  EXPECT_EQ(dead[big].attempt, 1) << "not retried";
  EXPECT_EQ(dead[big].value, "entry has 1048587 bytes of fields, over max_entry_bytes 1048576");
  EXPECT_EQ(dead[many].attempt, 1);
  EXPECT_EQ(dead[many].value, "entry has 1025 fields, over max_entry_fields 1024");
  for (const auto& keys : keys_of(redis, "crew:dead")) {
    for (const std::string& k : keys) EXPECT_NE(k.rfind("field:", 0), 0u) << k << " copied";
  }
  EXPECT_EQ(read_stream(redis, "crew:results").at(0).job, fine.at(0));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(ran_oversized.load(), 0);
  EXPECT_EQ(pending(redis), 0);
  const StreamSourceStats s = source.stats();
  EXPECT_EQ(s.oversized, 2u);
  EXPECT_EQ(s.dead_lettered, 2u);
  EXPECT_EQ(s.succeeded, 1u);
  EXPECT_EQ(s.retried, 0u);
}

// A consumer that stops with jobs unfinished leaves them pending; a live one
// claims them after claim_idle and runs them again (attempt 2).
TEST(StreamSource, ADeadConsumersJobsAreClaimedByALiveOne) {
  Watchdog dog;
  RedisServer redis;
  enqueue(redis, 5);
  ASSERT_NO_FATAL_FAILURE(orphan(redis, 5));
  EXPECT_EQ(pending(redis), 5);
  EXPECT_TRUE(read_stream(redis, "crew:results").empty());
  const auto stopped_at = std::chrono::steady_clock::now();
  Pool pool({.max_workers = 4});
  StreamSource b(pool, options_for(redis, "b"), echo);
  b.start();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == 5; }));
  const auto recovered_in = std::chrono::steady_clock::now() - stopped_at;
  EXPECT_LT(recovered_in, 300ms + 1s) << "claim idle time + 1 s";
  for (const Outcome& o : read_stream(redis, "crew:results")) EXPECT_EQ(o.attempt, 2);
  EXPECT_EQ(b.stats().claimed, 5u);
  ASSERT_TRUE(b.wait_idle(10s));
  EXPECT_EQ(pending(redis), 0);
}

// A busy consumer claims only what it has room for per XAUTOCLAIM; it keeps
// claiming while the scan is not through instead of waiting a claim round
// (claim_idle / 4) for each entry.
TEST(StreamSource, ABusyConsumerClaimsEveryOrphanWithoutARoundForEach) {
  Watchdog dog;
  RedisServer redis;
  constexpr int kOrphans = 24;
  enqueue(redis, kOrphans);
  ASSERT_NO_FATAL_FAILURE(orphan(redis, kOrphans));
  EXPECT_EQ(pending(redis), kOrphans);
  const auto stopped_at = std::chrono::steady_clock::now();
  Pool pool({.max_workers = 1});
  auto opts = options_for(redis, "b");
  opts.max_in_flight = 1;  // room for one entry per claim
  StreamSource b(pool, opts, echo);
  b.start();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == kOrphans; }));
  // One round per entry would take kOrphans * 75 ms after the idle time.
  EXPECT_LT(std::chrono::steady_clock::now() - stopped_at, opts.claim_idle + 1s);
  EXPECT_EQ(b.stats().claimed, static_cast<std::uint64_t>(kOrphans));
  ASSERT_TRUE(b.wait_idle(10s));
  EXPECT_EQ(pending(redis), 0);
}

TEST(StreamSource, AGracefulStopAcknowledgesOnlyWhatCompleted) {
  Watchdog dog;
  RedisServer redis;
  enqueue(redis, 10);
  Pool pool({.max_workers = 2, .queue_capacity = 100});
  std::atomic<int> started{0};
  Gate gate;
  auto opts = options_for(redis, "a");
  opts.max_in_flight = 6;
  StreamSource source(pool, opts, [&](const Job& job, std::stop_token) {
    started.fetch_add(1);
    gate.wait();
    return JobResult{true, job.id};
  });
  source.start();
  ASSERT_TRUE(eventually([&] { return started.load() == 2 && source.stats().in_flight == 6; }));
  source.stop();  // reading ends at once
  std::thread opener([&] {
    std::this_thread::sleep_for(20ms);
    gate.open();
  });
  (void)pool.shutdown(ShutdownMode::soft, 0s);  // the 2 running finish, the 4 queued are dropped
  opener.join();
  EXPECT_EQ(read_stream(redis, "crew:results").size(), 2u);
  EXPECT_EQ(pending(redis), 4) << "the unfinished jobs stay pending for another consumer";
  EXPECT_EQ(source.stats().read, 6u);
  EXPECT_EQ(source.stats().left_pending, 4u);
}

TEST(StreamSource, SurvivesARedisRestartWithoutLosingAJob) {
  Watchdog dog(60s);
  RedisServer redis(/*appendonly=*/true);
  const auto ids = enqueue(redis, 100);
  Pool pool({.max_workers = 2});
  StreamSource source(pool, options_for(redis, "a"), [](const Job& job, std::stop_token) {
    std::this_thread::sleep_for(3ms);
    return JobResult{true, job.id};
  });
  source.start();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() >= 20; }));
  redis.stop();
  ASSERT_TRUE(eventually([&] { return !source.connected(); }));
  std::this_thread::sleep_for(100ms);
  redis.start();
  ASSERT_TRUE(eventually([&] { return source.connected(); }, 10s));
  // Jobs that finished while Redis was down are written after it is back;
  // jobs taken but unacknowledged before the restart are claimed again.
  ASSERT_TRUE(eventually(
      [&] {
        std::set<std::string> done;
        for (const Outcome& o : read_stream(redis, "crew:results")) done.insert(o.job);
        return done.size() == ids.size();
      },
      30s));
  EXPECT_GE(source.stats().reconnects, 1u);
  ASSERT_TRUE(eventually([&] { return pending(redis) == 0; }, 10s));
}

TEST(StreamSource, InvalidOptionsAreRejectedWithTheFieldName) {
  Pool pool;
  auto bad = [&](StreamSourceOptions o) {
    try {
      StreamSource s(pool, std::move(o), echo);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(bad({.port = 0}).find("port"), std::string::npos);
  EXPECT_NE(bad({.stream = ""}).find("stream"), std::string::npos);
  EXPECT_NE(bad({.max_attempts = 0}).find("max_attempts"), std::string::npos);
  EXPECT_NE(bad({.max_entry_bytes = 0}).find("max_entry_bytes"), std::string::npos);
  EXPECT_NE(bad({.max_entry_fields = 0}).find("max_entry_fields"), std::string::npos);
  EXPECT_NE(bad({.reconnect_min = 10ms, .reconnect_max = 1ms}).find("reconnect_max"),
            std::string::npos);
}

}  // namespace
}  // namespace crew

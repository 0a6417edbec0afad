// Tests of crew::StreamSource against a real redis-server on loopback: each
// job is run and acknowledged after its outcome is written, backpressure,
// retries and the dead-letter stream, recovery of a dead consumer's jobs,
// a graceful stop, a Redis restart, the backoff after the pool refuses a
// job, and the jobs' priority level.
#include "crew/stream_source.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "crew/observer.hpp"
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
using test::WorkerHold;

// Counts the tasks that entered the queue. Unlike stats().queued, which
// counts a claimed queue slot a moment before its submitter has written the
// task there, this counts after the push, when a worker can take the task.
class Enqueued : public Observer {
 public:
  [[nodiscard]] std::uint32_t events() const noexcept override { return task_enqueued; }
  void on_task_enqueued(const TaskEvent& /*task*/) noexcept override { n_.fetch_add(1); }
  [[nodiscard]] int count() const noexcept { return n_.load(); }

 private:
  std::atomic<int> n_{0};
};

// The order in which tasks on the pool's workers noted themselves.
class Order {
 public:
  void note(std::string what) {
    const std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(std::move(what));
  }
  [[nodiscard]] std::vector<std::string> seen() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> seen_;
};

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

// How many times Redis ran `command` (INFO commandstats), e.g. "xreadgroup".
long calls_of(RedisServer& redis, const std::string& command) {
  const std::string info = redis.command({"INFO", "commandstats"});
  const std::string key = "cmdstat_" + command + ":calls=";
  const std::size_t at = info.find(key);
  return at == std::string::npos ? 0 : std::stol(info.substr(at + key.size()));
}

// A pool whose overload controller refuses every submission (its one worker
// and its admission limit of 2 are taken by two held tasks) while the
// source holds entries: the source neither reads again nor submits again
// at once, but backs off, doubling from overload_backoff_min; nothing is
// lost or run twice once the pool accepts again.
TEST(StreamSource, BacksOffWhileThePoolRefusesAndLosesNoEntry) {
  Watchdog dog;
  RedisServer redis;
  constexpr int kJobs = 20;
  const auto ids = enqueue(redis, kJobs);
  PoolOptions po = test::fixed_workers("refusing", 1);
  po.overload = {.enabled = true, .interval = 60s, .max_limit = 2};  // no interval ends
  Pool pool(po);
  Gate gate;
  for (int i = 0; i < 2; ++i) ASSERT_EQ(pool.post([&] { gate.wait(); }), Admission::accepted);
  std::mutex mu;
  std::map<std::string, int> runs;
  auto opts = options_for(redis, "a");
  opts.max_in_flight = 8;
  opts.overload_backoff_min = 10ms;
  opts.overload_backoff_max = 1s;
  StreamSource source(pool, opts, [&](const Job& job, std::stop_token stop) {
    {
      const std::lock_guard<std::mutex> lock(mu);
      ++runs[job.id];
    }
    return echo(job, stop);
  });
  source.start();
  ASSERT_TRUE(eventually([&] { return source.stats().refused >= 1; }));
  const auto window_start = std::chrono::steady_clock::now();
  const long reads_before = calls_of(redis, "xreadgroup");
  const std::uint64_t refused_before = pool.stats().overload.refused_limit;
  std::this_thread::sleep_for(600ms);
  const auto window = std::chrono::steady_clock::now() - window_start;
  const long reads = calls_of(redis, "xreadgroup") - reads_before;
  const std::uint64_t refusals = pool.stats().overload.refused_limit - refused_before;
  // Backoffs of 10, 20, 40, 80, 160, 320 ms (less up to a quarter each) sum
  // to at least 472 ms: at most 7 submissions in 600 ms (under a sanitizer
  // the window may run long, so the bound follows the time it took). Without
  // a backoff, a refused submission is followed by the next at once.
  const long window_ms = std::chrono::duration_cast<std::chrono::milliseconds>(window).count();
  EXPECT_LE(refusals, 7u + static_cast<std::uint64_t>(std::max(0L, window_ms - 600) / 750))
      << "in " << window_ms << " ms";
  EXPECT_GE(refusals, 2u) << "it submits again after each backoff";
  EXPECT_EQ(reads, 0) << "nothing new is read while it backs off";
  EXPECT_EQ(source.stats().read, 8u) << "the refused entries stay held: no room for more";
  EXPECT_EQ(pending(redis), 8) << "and stay pending, unacknowledged";
  EXPECT_EQ(source.stats().left_pending, 0u);
  gate.open();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == kJobs; }, 20s));
  ASSERT_TRUE(source.wait_idle(10s));
  std::set<std::string> seen;
  for (const Outcome& o : read_stream(redis, "crew:results")) {
    EXPECT_EQ(o.status, "ok");
    EXPECT_EQ(o.attempt, 1) << "a refusal is not a failed attempt";
    EXPECT_TRUE(seen.insert(o.job).second) << "duplicate result for " << o.job;
  }
  EXPECT_EQ(seen, std::set<std::string>(ids.begin(), ids.end()));
  {
    const std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(runs.size(), static_cast<std::size_t>(kJobs));
    for (const auto& [id, n] : runs) EXPECT_EQ(n, 1) << id << " ran " << n << " times";
  }
  EXPECT_EQ(pending(redis), 0);
  const StreamSourceStats s = source.stats();
  EXPECT_EQ(s.refused, pool.stats().overload.refused_limit);
  EXPECT_EQ(s.claimed, 0u);
  EXPECT_EQ(s.left_pending, 0u);
  EXPECT_EQ(s.retried, 0u);
}

// A stream job the overload controller sheds unrun (here displaced by a
// higher priority's submission at the limit) is not lost or left pending
// for claim_idle: it goes back to the source and is submitted again after
// a backoff, and runs once.
TEST(StreamSource, AJobShedFromTheQueueIsSubmittedAgainAndRunsOnce) {
  Watchdog dog;
  RedisServer redis;
  const auto ids = enqueue(redis, 1);
  PoolOptions po = test::fixed_workers("shedding", 1);
  po.priority_levels = 2;
  po.overload = {.enabled = true, .interval = 60s, .max_limit = 2};
  Pool pool(po);
  WorkerHold hold(pool);
  Order order;
  auto opts = options_for(redis, "a");
  opts.claim_idle = 60s;  // a job left pending would not come back within the test
  StreamSource source(pool, opts, [&](const Job& job, std::stop_token stop) {
    order.note("stream");
    return echo(job, stop);
  });
  source.start();
  // The stream job takes the limit's last ticket and queues newest first;
  // a submission at the limit finds it to displace once its push is
  // complete (it is counted as queued a moment before).
  ASSERT_TRUE(eventually([&] { return pool.stats().queued == 1; }));
  ASSERT_TRUE(eventually([&] {
    return pool.post([&] { order.note("level 1"); }, {.priority = 1}) == Admission::accepted;
  }));
  EXPECT_EQ(pool.stats().overload.shed_priority, 1u);
  EXPECT_TRUE(eventually([&] { return source.stats().refused == 1; }));
  EXPECT_EQ(source.stats().in_flight, 1u) << "held while it waits to be submitted again";
  hold.release();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == 1; }));
  ASSERT_TRUE(source.wait_idle(10s));
  const Outcome o = read_stream(redis, "crew:results").at(0);
  EXPECT_EQ(o.job, ids.at(0));
  EXPECT_EQ(o.attempt, 1);
  EXPECT_EQ(pending(redis), 0);
  EXPECT_EQ(source.stats().left_pending, 0u);
  EXPECT_EQ(order.seen(), (std::vector<std::string>{"level 1", "stream"}));
}

// StreamSourceOptions::priority is the level its jobs queue at: with the one
// worker held and a level-0 task queued first, a stream job of level 1
// starts before it.
TEST(StreamSource, JobsQueueAtTheConfiguredPriority) {
  Watchdog dog;
  RedisServer redis;
  enqueue(redis, 1);
  PoolOptions po = test::fixed_workers("levels", 1);
  po.priority_levels = 2;
  auto enqueued = std::make_shared<Enqueued>();
  po.observers.push_back(enqueued);
  Pool pool(po);
  WorkerHold hold(pool);
  Order order;
  ASSERT_EQ(pool.post([&] { order.note("level 0"); }), Admission::accepted);
  auto opts = options_for(redis, "a");
  opts.priority = 1;
  StreamSource source(pool, opts, [&](const Job& job, std::stop_token stop) {
    order.note("stream");
    return echo(job, stop);
  });
  source.start();
  // The holding task, the level-0 task and the stream job.
  ASSERT_TRUE(eventually([&] { return enqueued->count() == 3; }));
  hold.release();
  ASSERT_TRUE(eventually([&] { return read_stream(redis, "crew:results").size() == 1; }));
  ASSERT_TRUE(pool.wait_idle(10s));
  EXPECT_EQ(order.seen(), (std::vector<std::string>{"stream", "level 0"}));
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
  EXPECT_NE(bad({.priority = 1}).find("priority"), std::string::npos) << "the pool has one level";
  EXPECT_NE(bad({.overload_backoff_min = 0ms}).find("overload_backoff_min"), std::string::npos);
  EXPECT_NE(
      bad({.overload_backoff_min = 10ms, .overload_backoff_max = 1ms}).find("overload_backoff_max"),
      std::string::npos);
}

}  // namespace
}  // namespace crew

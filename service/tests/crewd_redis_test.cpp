// crewd's [redis] jobs: the settings, the entry parser, and crewd processes
// consuming one stream from a redis-server on a free loopback port: an
// instance killed and one stopped mid-run lose no job, a Redis restart is
// survived (with /readyz 503 meanwhile), failures end in the dead-letter
// stream, and a SIGTERM stops reading at once.
//
// The figures of docs/distributed.md come from CrewdRedisFigures, which runs
// only when CREWD_REDIS_FIGURES=1 (bench/crewd_redis.sh sets it).
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/config.hpp"
#include "crewd_harness.hpp"
#include "crewd_redis_client.hpp"
#include "jobs/redis_jobs.hpp"
#include "redis_server.hpp"

namespace crewd::test {
namespace {

using crew::test::RedisServer;
using crew::test::Watchdog;

// ---- the settings and the entry parser ----

const Environment no_env;

TEST(CrewdRedisConfig, IsOffByDefaultAndReadFromFileEnvAndFlags) {
  const LoadResult defaults = load_config({}, no_env);
  ASSERT_TRUE(defaults.run) << defaults.err;
  EXPECT_TRUE(defaults.config.redis.address.empty());
  EXPECT_EQ(defaults.config.redis.stream, "crew:jobs");
  EXPECT_EQ(defaults.config.redis.group, "crew");
  EXPECT_TRUE(defaults.config.redis.consumer.empty());
  EXPECT_EQ(stream_source_options(defaults.config).priority, 0u) << "stream jobs queue as low";

  const Environment env = {{"CREWD_REDIS_ADDRESS", "redis.svc:6379"},
                           {"CREWD_REDIS_CLAIM_IDLE_MS", "1500"},
                           {"CREWD_REDIS_PASSWORD", "s3cret"}};
  const LoadResult r = load_config(
      {"--redis-consumer", "crewd-0", "--redis-max-attempts", "5", "--redis-claim-idle-ms", "900"},
      env);
  ASSERT_TRUE(r.run) << r.err;
  EXPECT_EQ(r.config.redis.address, "redis.svc:6379");
  EXPECT_EQ(r.config.redis.password, "s3cret");
  EXPECT_EQ(r.config.redis.consumer, "crewd-0");
  EXPECT_EQ(r.config.redis.max_attempts, 5u);
  EXPECT_EQ(r.config.redis.claim_idle, std::chrono::milliseconds(900));  // flag over env

  const crew::StreamSourceOptions o = stream_source_options(r.config);
  EXPECT_EQ(o.host, "redis.svc");
  EXPECT_EQ(o.port, 6379);
  EXPECT_EQ(o.max_in_flight, r.config.jobs.workers) << "in_flight 0: the jobs pool's workers";

  const LoadResult high = load_config({"--redis-priority", "2"}, no_env);
  ASSERT_TRUE(high.run) << high.err;
  EXPECT_EQ(stream_source_options(high.config).priority, 2u);
}

TEST(CrewdRedisConfig, HelpAndPrintConfigListTheSettingsButNotThePassword) {
  const LoadResult help = load_config({"--help"}, no_env);
  for (const char* flag :
       {"--redis-address", "--redis-stream", "--redis-group", "--redis-consumer",
        "--redis-claim-idle-ms", "--redis-max-attempts", "CREWD_REDIS_ADDRESS"}) {
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag;
  }
  const LoadResult printed = load_config({"--print-config", "--redis-password", "s3cret"}, no_env);
  EXPECT_NE(printed.out.find("[redis]"), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("claim_idle_ms = 30000"), std::string::npos) << printed.out;
  EXPECT_EQ(printed.out.find("s3cret"), std::string::npos) << printed.out;
}

TEST(CrewdRedisConfig, RefusesBadAddressesAndInconsistentSettings) {
  const auto error_of = [](std::vector<std::string> args) {
    const LoadResult r = load_config(args, no_env);
    EXPECT_EQ(r.exit_code, kConfigErrorExit) << r.out;
    return r.err;
  };
  for (const char* bad : {"redis", "redis:0", "redis:65536", ":6379", "re dis:1"}) {
    EXPECT_NE(error_of({"--redis-address", bad}).find("redis.address"), std::string::npos) << bad;
  }
  EXPECT_NE(error_of({"--redis-address", "h:1", "--jobs-workers", "2", "--jobs-queue", "2",
                      "--redis-in-flight", "5"})
                .find("redis.in_flight"),
            std::string::npos);
  EXPECT_NE(error_of({"--redis-address", "h:1", "--redis-results-stream", "crew:jobs"})
                .find("must differ"),
            std::string::npos);
  EXPECT_NE(error_of({"--redis-stream", "has space"}).find("redis.stream"), std::string::npos);
  EXPECT_NE(error_of({"--redis-priority", "3"}).find("redis.priority"), std::string::npos)
      << "the jobs pool has three levels";
}

TEST(CrewdRedisFields, AreValidatedLikeThePostBody) {
  const JobLimits limits;
  const auto ok = parse_job_fields(
      {{"kind", "spin"}, {"ms", "12"}, {"timeout_ms", "300"}, {"name", "x:1"}}, limits);
  ASSERT_TRUE(std::holds_alternative<JobRequest>(ok));
  EXPECT_EQ(std::get<JobRequest>(ok),
            (JobRequest{.kind = JobKind::spin, .ms = 12, .timeout_ms = 300, .name = "x:1"}));
  const auto defaults = parse_job_fields({{"kind", "sleep"}, {"ms", "0"}}, limits);
  ASSERT_TRUE(std::holds_alternative<JobRequest>(defaults));
  EXPECT_EQ(std::get<JobRequest>(defaults).timeout_ms, limits.default_timeout_ms);
  EXPECT_EQ(std::get<JobRequest>(defaults).name, "sleep");

  const std::vector<std::pair<Fields, std::string>> bad = {
      {{{"kind", "fail"}, {"ms", "1"}}, "kind must be"},
      {{{"kind", "sleep"}}, "ms is required"},
      {{{"kind", "sleep"}, {"ms", "-1"}}, "ms must be an integer in 0..10000"},
      {{{"kind", "sleep"}, {"ms", "1.5"}}, "ms must be an integer"},
      {{{"kind", "sleep"}, {"ms", "99999999999999999999999"}}, "ms must be an integer"},
      {{{"kind", "sleep"}, {"ms", "1"}, {"timeout_ms", "0"}}, "timeout_ms must be"},
      {{{"kind", "sleep"}, {"ms", "1"}, {"name", "a b"}}, "name must be"},
      {{{"kind", "sleep"}, {"ms", "1"}, {"colour", "red"}}, "unknown field 'colour'"},
      {{{"kind", "sleep"}, {"ms", "1"}, {"\xff\xfe", "x"}}, "unknown field"},
  };
  for (const auto& [fields, message] : bad) {
    const auto r = parse_job_fields(fields, limits);
    ASSERT_TRUE(std::holds_alternative<ParseError>(r)) << message;
    EXPECT_NE(std::get<ParseError>(r).message.find(message), std::string::npos)
        << std::get<ParseError>(r).message;
  }
}

// ---- crewd processes and Redis ----

std::unique_ptr<Crewd> start_instance(Watchdog& dog, int redis_port, const std::string& consumer,
                                      std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--listen",
                                   "127.0.0.1:0",
                                   "--redis-address",
                                   "127.0.0.1:" + std::to_string(redis_port),
                                   "--redis-consumer",
                                   consumer,
                                   "--redis-claim-idle-ms",
                                   std::to_string(kClaimIdle.count()),
                                   "--jobs-workers",
                                   "16"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto c = std::make_unique<Crewd>(args);
  dog.guard(c->pid());
  return c;
}

// A sample's value from /metrics text ("name" or "name{labels}"); -1 if absent.
double metric_value(const std::string& text, const std::string& sample) {
  const auto pos = text.find("\n" + sample + " ");
  if (pos == std::string::npos) return -1;
  return std::atof(text.c_str() + pos + sample.size() + 2);
}

bool exited_cleanly(Crewd& c, std::chrono::milliseconds bound) {
  const auto status = c.wait_exit(bound * kSlowdown);
  return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

// Three instances share 100,000 jobs; mid-run one is killed (SIGKILL) and
// one stopped (SIGTERM, drain). Every job gets a result; the killed
// instance's pending jobs are finished by the survivor within claim idle
// time + 1 s; duplicates are at most what the killed one had taken.
TEST(CrewdRedis, ThreeInstancesLoseNoJobWhenOneIsKilledAndOneStopped) {
  Watchdog dog(120s);
  RedisServer redis;
  Client client(redis.port());
  dog.guard(static_cast<pid_t>(client.server_pid()));
  // Under a sanitizer crewd is several times slower: a fifth of the jobs.
  const int n = 100'000 / kSlowdown;
  const std::vector<std::string> ids = client.enqueue(n, {{"kind", "sleep"}, {"ms", "1"}});
  ASSERT_EQ(ids.size(), static_cast<std::size_t>(n));
  constexpr std::size_t kInFlight = 16;  // --jobs-workers 16, redis.in_flight 0: the workers

  auto a = start_instance(dog, redis.port(), "a");
  auto b = start_instance(dog, redis.port(), "b");
  auto c = start_instance(dog, redis.port(), "c");
  for (Crewd* p : {a.get(), b.get(), c.get()}) ASSERT_GT(p->wait_port(), 0) << p->log();
  const auto started = Clock::now();

  StreamReader results(client, "crew:results");
  ASSERT_TRUE(results.wait_for([&] { return results.distinct() >= ids.size() * 3 / 10; }, 60s));
  a->signal(SIGKILL);
  ASSERT_TRUE(a->wait_exit(5s).has_value());
  const long long killed_ms = client.now_ms();
  const std::vector<std::string> orphans = client.pending_ids("a");
  EXPECT_LE(orphans.size(), kInFlight) << "an instance never holds more than its in_flight";

  ASSERT_TRUE(results.wait_for([&] { return results.distinct() >= ids.size() / 2; }, 60s));
  b->signal(SIGTERM);
  EXPECT_TRUE(exited_cleanly(*b, 20s)) << b->log();
  EXPECT_EQ(client.pending("b"), 0) << "drain: b finished and acknowledged what it had taken";

  // Recovery: from the kill until the last of a's pending jobs has a
  // result, on Redis' clock.
  ASSERT_TRUE(results.wait_for(
      [&] {
        return std::all_of(orphans.begin(), orphans.end(),
                           [&](const std::string& id) { return results.has(id); });
      },
      30s));
  long long recovered_ms = 0;
  for (const std::string& id : orphans) {
    recovered_ms = std::max(recovered_ms, results.first_ms(id) - killed_ms);
  }

  ASSERT_TRUE(results.wait_for([&] { return results.distinct() == ids.size(); }, 60s))
      << results.distinct() << " of " << ids.size() << " jobs have a result\n"
      << c->log();
  const auto finished = Clock::now();
  ASSERT_TRUE(results.wait_for([&] { return client.pending() == 0; }, 10s))
      << client.pending() << " entries still pending";

  for (const std::string& id : ids) ASSERT_TRUE(results.has(id)) << "no result for " << id;
  for (const Outcome& o : results.all()) {
    EXPECT_EQ(o.status, "ok") << o.job << ": " << o.value;
    if (std::find(orphans.begin(), orphans.end(), o.job) != orphans.end()) {
      EXPECT_GE(o.attempt, 2) << "a claimed job runs as a second delivery";
      EXPECT_NE(o.instance, "a");
    }
  }
  const std::size_t duplicates = results.total() - results.distinct();
  std::printf(
      "[ figures  ] %d jobs, 3 instances (a killed, b stopped): %.0f jobs/s overall; "
      "%zu duplicates; a had %zu pending, finished elsewhere %.0f ms after the kill "
      "(claim idle %lld ms)\n",
      n, n / std::chrono::duration<double>(finished - started).count(), duplicates, orphans.size(),
      static_cast<double>(recovered_ms), static_cast<long long>(kClaimIdle.count()));
  EXPECT_LE(duplicates, kInFlight) << "only jobs in flight on the killed instance may run twice";
  EXPECT_LT(std::chrono::milliseconds(recovered_ms), kClaimIdle + 1s * kSlowdown)
      << "claim idle time + 1 s";

  c->signal(SIGTERM);
  EXPECT_TRUE(exited_cleanly(*c, 20s)) << c->log();
}

// Redis stops and comes back (append-only file, same port and directory):
// /readyz says 503 meanwhile, the instances reconnect and every job is done.
TEST(CrewdRedis, InstancesSurviveARedisRestartAndAreNotReadyMeanwhile) {
  Watchdog dog(90s);
  RedisServer redis(/*appendonly=*/true);
  Client client(redis.port());
  dog.guard(static_cast<pid_t>(client.server_pid()));
  const int n = 10'000 / kSlowdown;
  const std::vector<std::string> ids = client.enqueue(n, {{"kind", "sleep"}, {"ms", "1"}});
  ASSERT_EQ(ids.size(), static_cast<std::size_t>(n));
  auto a = start_instance(dog, redis.port(), "a");
  auto b = start_instance(dog, redis.port(), "b");
  std::vector<int> ports;
  for (Crewd* p : {a.get(), b.get()}) {
    ports.push_back(p->wait_port());
    ASSERT_GT(ports.back(), 0) << p->log();
  }

  StreamReader results(client, "crew:results");
  ASSERT_TRUE(results.wait_for([&] { return results.distinct() >= ids.size() / 5; }, 30s));
  redis.stop();
  for (const int port : ports) {
    const auto deadline = Clock::now() + 5s * kSlowdown;
    Exchange ready;
    do {
      ready = get(port, "/readyz");
    } while (ready.status != 503 && Clock::now() < deadline);
    EXPECT_EQ(ready.status, 503) << "while Redis is down";
    EXPECT_NE(ready.body.find("redis disconnected"), std::string::npos) << ready.body;
  }
  std::this_thread::sleep_for(300ms);
  for (const int port : ports) EXPECT_EQ(get(port, "/readyz").status, 503);
  redis.start();
  dog.guard(static_cast<pid_t>(client.server_pid()));
  for (const int port : ports) {
    const auto deadline = Clock::now() + 10s * kSlowdown;
    while (get(port, "/readyz").status != 200 && Clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(get(port, "/readyz").status, 200) << "reconnected";
  }

  ASSERT_TRUE(results.wait_for([&] { return results.distinct() == ids.size(); }, 60s))
      << results.distinct() << " of " << ids.size() << " jobs have a result\n"
      << a->log() << b->log();
  for (const std::string& id : ids) ASSERT_TRUE(results.has(id)) << "no result for " << id;
  ASSERT_TRUE(results.wait_for([&] { return client.pending() == 0; }, 10s));
  std::printf("[ figures  ] Redis restart: %zu results for %d jobs (%zu duplicates)\n",
              results.total(), n, results.total() - results.distinct());
  for (const int port : ports) {
    const std::string metrics = get(port, "/metrics").body;
    EXPECT_GE(metric_value(metrics, "crewd_redis_reconnects_total"), 1) << metrics;
    EXPECT_EQ(metric_value(metrics, "crewd_redis_connected"), 1) << metrics;
  }
  for (Crewd* p : {a.get(), b.get()}) {
    p->signal(SIGTERM);
    EXPECT_TRUE(exited_cleanly(*p, 20s)) << p->log();
  }
}

// A job that fails every attempt (here: it always runs past its deadline,
// which POST /api/v1/jobs answers with 504) and an entry that is not a valid
// job both end in the dead-letter stream, with their error and fields.
// redis.max_entry_bytes: an entry over it is dead-lettered at once, unrun
// and without its fields; the next entry runs.
TEST(CrewdRedis, AnEntryOverMaxEntryBytesIsDeadLetteredUnrun) {
  Watchdog dog(60s);
  RedisServer redis;
  Client client(redis.port());
  dog.guard(static_cast<pid_t>(client.server_pid()));
  const auto big =
      client.enqueue(1, {{"kind", "sleep"}, {"ms", "1"}, {"pad", std::string(2048, 'x')}});
  const auto fine = client.enqueue(1, {{"kind", "sleep"}, {"ms", "1"}});
  auto a = start_instance(dog, redis.port(), "a", {"--redis-max-entry-bytes", "1024"});
  ASSERT_GT(a->wait_port(), 0) << a->log();
  StreamReader dead(client, "crew:dead");
  StreamReader results(client, "crew:results");
  ASSERT_TRUE(dead.wait_for([&] { return dead.total() == 1; }, 20s)) << a->log();
  ASSERT_TRUE(results.wait_for([&] { return results.total() == 1; }, 20s)) << a->log();
  const Outcome d = dead.all().at(0);
  EXPECT_EQ(d.job, big.at(0));
  EXPECT_EQ(d.status, "dead");
  EXPECT_EQ(d.attempt, 1) << "not retried";
  EXPECT_EQ(d.value, "entry has 2063 bytes of fields, over max_entry_bytes 1024");
  EXPECT_EQ(results.all().at(0).job, fine.at(0));
  ASSERT_TRUE(results.wait_for([&] { return client.pending() == 0; }, 10s));
}

TEST(CrewdRedis, AJobThatAlwaysFailsIsDeadLetteredWithItsError) {
  Watchdog dog(60s);
  RedisServer redis;
  Client client(redis.port());
  dog.guard(static_cast<pid_t>(client.server_pid()));
  const auto overrun = client.enqueue(
      1, {{"kind", "spin"}, {"ms", "1000"}, {"timeout_ms", "20"}, {"name", "overrun"}});
  const auto invalid = client.enqueue(1, {{"kind", "explode"}, {"ms", "1"}});
  const auto fine = client.enqueue(1, {{"kind", "sleep"}, {"ms", "1"}});
  auto a = start_instance(dog, redis.port(), "a",
                          {"--redis-max-attempts", "2", "--redis-retry-backoff-ms", "10"});
  const int port = a->wait_port();
  ASSERT_GT(port, 0) << a->log();

  StreamReader dead(client, "crew:dead");
  StreamReader results(client, "crew:results");
  ASSERT_TRUE(dead.wait_for([&] { return dead.total() == 2; }, 20s)) << a->log();
  ASSERT_TRUE(results.wait_for([&] { return results.total() == 1; }, 20s)) << a->log();
  std::map<std::string, Outcome> by_job;
  for (const Outcome& o : dead.all()) by_job[o.job] = o;
  ASSERT_EQ(by_job.count(overrun.at(0)), 1u);
  EXPECT_EQ(by_job[overrun[0]].status, "dead");
  EXPECT_EQ(by_job[overrun[0]].attempt, 2) << "redis.max_attempts";
  EXPECT_EQ(by_job[overrun[0]].value, "the job ran past its deadline (timeout_ms 20)");
  ASSERT_EQ(by_job.count(invalid.at(0)), 1u);
  EXPECT_EQ(by_job[invalid[0]].value, "invalid job: kind must be \"sleep\" or \"spin\"");
  EXPECT_EQ(results.all().at(0).job, fine.at(0));
  EXPECT_EQ(results.all().at(0).value, R"({"kind":"sleep","ms":1,"name":"sleep"})");
  // The dead letter keeps the entry's fields, for a replay.
  const Reply entries = client.run({"XRANGE", "crew:dead", "-", "+"});
  ASSERT_TRUE(entries && entries->elements == 2);
  std::string fields;
  for (std::size_t e = 0; e < entries->elements; ++e) {
    const redisReply* kv = entries->element[e]->element[1];
    for (std::size_t k = 0; k < kv->elements; ++k) fields += str(kv->element[k]) + " ";
    fields += "\n";
  }
  EXPECT_NE(fields.find("field:kind spin field:ms 1000 field:timeout_ms 20 field:name overrun"),
            std::string::npos)
      << fields;
  ASSERT_TRUE(results.wait_for([&] { return client.pending() == 0; }, 10s));

  // The same job sent over HTTP fails the same way.
  const Exchange http =
      post(port, "/api/v1/jobs", R"({"kind":"spin","ms":1000,"timeout_ms":20,"name":"overrun"})");
  EXPECT_EQ(http.status, 504) << http.body;

  const std::string metrics = get(port, "/metrics").body;
  EXPECT_EQ(metric_value(metrics, R"(crewd_redis_jobs_total{outcome="dead_lettered"})"), 2)
      << metrics;
  EXPECT_EQ(metric_value(metrics, R"(crewd_redis_jobs_total{outcome="succeeded"})"), 1);
  EXPECT_EQ(metric_value(metrics, "crewd_redis_job_retries_total"), 2);
  a->signal(SIGTERM);
  EXPECT_TRUE(exited_cleanly(*a, 20s)) << a->log();
}

// SIGTERM: the source takes nothing more from the stream, and the jobs pool's
// shutdown mode decides the jobs taken: drain finishes them all, soft the
// running ones (the queued ones stay pending), hard none (all stay pending).
struct StopCase {
  const char* mode;
  long long results;  // of the 6 taken: 2 running on 2 workers, 4 queued
};

void PrintTo(const StopCase& c, std::ostream* out) { *out << c.mode; }

class CrewdRedisStop : public ::testing::TestWithParam<StopCase> {};

TEST_P(CrewdRedisStop, ATermStopsReadingAndLeavesUnfinishedJobsPending) {
  Watchdog dog(60s);
  RedisServer redis;
  Client client(redis.port());
  dog.guard(static_cast<pid_t>(client.server_pid()));
  constexpr int kJobs = 20;
  constexpr long long kTaken = 6;
  client.enqueue(kJobs, {{"kind", "sleep"}, {"ms", "800"}});
  auto a = std::make_unique<Crewd>(std::vector<std::string>{
      "--listen", "127.0.0.1:0", "--redis-address", "127.0.0.1:" + std::to_string(redis.port()),
      "--redis-consumer", "a", "--jobs-workers", "2", "--redis-in-flight", "6", "--shutdown-mode",
      GetParam().mode,
      // 4 of the 6 jobs in flight wait 800 ms in the queue: the overload
      // controller (crewd's default) would shed them. This test is about
      // the stop, so it is off.
      "--jobs-overload", "false"});
  dog.guard(a->pid());
  ASSERT_GT(a->wait_port(), 0) << a->log();
  StreamReader results(client, "crew:results");
  ASSERT_TRUE(results.wait_for([&] { return client.pending("a") == kTaken; }, 10s)) << a->log();
  ASSERT_EQ(results.total(), 0u) << "the signal must come while the first jobs run";
  a->signal(SIGTERM);
  EXPECT_TRUE(exited_cleanly(*a, 20s)) << a->log();
  results.poll();
  EXPECT_EQ(static_cast<long long>(results.total()), GetParam().results) << a->log();
  EXPECT_EQ(client.pending("a"), kTaken - GetParam().results) << "unfinished: pending";
  EXPECT_EQ(client.group_info("lag"), kJobs - kTaken) << "nothing read after the SIGTERM";
  EXPECT_NE(a->log().find("stopped reading the Redis stream"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Modes, CrewdRedisStop,
                         ::testing::Values(StopCase{"drain", 6}, StopCase{"soft", 2},
                                           StopCase{"hard", 0}),
                         [](const auto& p) { return std::string(p.param.mode); });

// ---- figures (docs/distributed.md) ----

struct RunFigures {
  double jobs_per_s = 0;
  double redis_cores = 0;  // CPU time of redis-server / wall time
  double crewd_cores = 0;  // of all crewd processes together
  std::map<std::string, double> calls_per_job;
  double entries_per_read = 0;
};

// CPU time (user + system) of a running process, from /proc.
double process_cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; fields >> f && i <= 15; ++i) {
    if (i == 14 || i == 15) ticks += std::atof(f.c_str());  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// `instances` crewd consume `n` 1 ms jobs enqueued beforehand. Throughput is
// measured on Redis' clock, from the first result to the last one.
RunFigures measure(int instances, int n, const std::vector<std::string>& extra) {
  Watchdog dog(120s);
  RedisServer redis;
  Client client(redis.port());
  dog.guard(static_cast<pid_t>(client.server_pid()));
  const auto ids = client.enqueue(n, {{"kind", "sleep"}, {"ms", "1"}});
  client.run({"CONFIG", "RESETSTAT"});
  const double redis_cpu_before = client.cpu_seconds();
  const auto started = Clock::now();
  std::vector<std::unique_ptr<Crewd>> crewds;
  for (int i = 0; i < instances; ++i) {
    std::vector<std::string> args = {
        "--listen",         "127.0.0.1:0",
        "--redis-address",  "127.0.0.1:" + std::to_string(redis.port()),
        "--redis-consumer", "c" + std::to_string(i)};
    args.insert(args.end(), extra.begin(), extra.end());
    crewds.push_back(std::make_unique<Crewd>(args));
    dog.guard(crewds.back()->pid());
  }
  StreamReader results(client, "crew:results");
  EXPECT_TRUE(results.wait_for([&] { return results.distinct() == ids.size(); }, 100s));
  RunFigures f;
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  f.redis_cores = (client.cpu_seconds() - redis_cpu_before) / wall;
  for (auto& c : crewds) f.crewd_cores += process_cpu_seconds(c->pid()) / wall;
  if (results.total() < 2) return f;
  const double ms =
      static_cast<double>(id_ms(results.all().back().id) - id_ms(results.all().front().id));
  f.jobs_per_s = static_cast<double>(results.total() - 1) / (ms / 1000.0);
  const auto calls = client.command_calls();  // calls_text() leaves out the test's own
  for (const auto& [cmd, count] : calls) {
    f.calls_per_job[cmd] = static_cast<double>(count) / n;
  }
  if (calls.count("xreadgroup") != 0) {
    f.entries_per_read = static_cast<double>(n) / static_cast<double>(calls.at("xreadgroup"));
  }
  for (auto& c : crewds) {
    c->signal(SIGTERM);
    EXPECT_TRUE(exited_cleanly(*c, 20s)) << c->log();
  }
  return f;
}

// Redis' calls per job, without the test's own commands; and the round
// trips per job they make (XADD and XACK of one outcome share one).
std::string calls_text(const RunFigures& f) {
  std::string out;
  char buf[64];
  double round_trips = 0;
  for (const auto& [cmd, per_job] : f.calls_per_job) {
    if (cmd == "xrange" || cmd == "info" || cmd.rfind("config", 0) == 0 || cmd == "xadd|" ||
        cmd == "time") {
      continue;
    }
    if (cmd != "xack") round_trips += per_job;
    std::snprintf(buf, sizeof buf, " %s %.4f", cmd.c_str(), per_job);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "; %.2f round trips", round_trips);
  return out + buf;
}

// Each configuration runs three times; the median run is printed.
TEST(CrewdRedisFigures, ThroughputRoundTripsAndBatching) {
  if (std::getenv("CREWD_REDIS_FIGURES") == nullptr) {
    GTEST_SKIP() << "figures only on request: CREWD_REDIS_FIGURES=1 (bench/crewd_redis.sh)";
  }
  const int n = 30'000 / kSlowdown;
  const auto median = [&](int instances, const std::vector<std::string>& extra) {
    std::vector<RunFigures> runs;
    for (int i = 0; i < 3; ++i) runs.push_back(measure(instances, n, extra));
    std::sort(runs.begin(), runs.end(),
              [](const RunFigures& x, const RunFigures& y) { return x.jobs_per_s < y.jobs_per_s; });
    return runs[1];
  };
  for (int instances = 1; instances <= 3; ++instances) {
    const RunFigures f = median(instances, {});
    std::printf(
        "[ figures  ] %d instance(s), %d jobs of 1 ms: %.0f jobs/s; calls per job:%s; "
        "%.2f entries per XREADGROUP; CPU cores busy: redis %.2f, crewd %.2f\n",
        instances, n, f.jobs_per_s, calls_text(f).c_str(), f.entries_per_read, f.redis_cores,
        f.crewd_cores);
  }
  // COUNT caps a read; what the instance has room for decides it.
  for (const char* batch : {"1", "64"}) {
    for (const char* workers : {"8", "64"}) {
      const RunFigures f = median(1, {"--redis-batch", batch, "--jobs-workers", workers});
      std::printf(
          "[ figures  ] 1 instance, redis.batch %s, jobs.workers %s: %.0f jobs/s; calls "
          "per job:%s; %.2f entries per XREADGROUP\n",
          batch, workers, f.jobs_per_s, calls_text(f).c_str(), f.entries_per_read);
    }
  }
}

}  // namespace
}  // namespace crewd::test

// Jobs that wait: sleep and call jobs are coroutine tasks of the jobs pool,
// holding no worker while they wait (docs/crewd.md, "Jobs that wait"); and
// the I/O thread's own wait for a job's outcome, which it must not spend
// on the CPU the job's worker needs. Each test runs its own crewd; every
// wait is bounded.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "affinity.hpp"
#include "crewd_harness.hpp"
#include "crewd_suite.hpp"
#include "slow_downstream.hpp"

namespace crewd::test {
namespace {

using Json = nlohmann::json;

Json json_of(const Exchange& ex) { return Json::parse(ex.body, nullptr, false); }

// Raises the soft descriptor limit to the hard one: a test holds a
// connection per job.
void raise_descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &r);
  }
}

// Sends `n` job requests, each on its own connection, all before reading
// any answer, then reads every answer until `deadline`: the answers in
// sending order (outcome timeout for one that did not come in time).
std::vector<Exchange> post_all(int port, const std::string& body, int n,
                               Clock::time_point deadline) {
  wait_for_connection_tracking_room(static_cast<std::size_t>(n));
  const std::string request = request_text("POST", "/api/v1/jobs", body);
  std::vector<Socket> sockets;
  std::vector<Exchange> out(static_cast<std::size_t>(n));
  for (auto& ex : out) {
    ex.started = Clock::now();
    Socket s = connect_to(port);
    ex.outcome = Exchange::Outcome::timeout;  // until its answer is read
    if (s.fd() < 0 || !write_all(s.fd(), request, ex.error)) {
      ex.outcome = Exchange::Outcome::error;
    }
    ex.sent = Clock::now();
    sockets.push_back(std::move(s));
  }
  std::vector<std::string> raw(out.size());
  std::vector<pollfd> waiting;
  while (Clock::now() < deadline) {
    waiting.clear();
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out[i].outcome == Exchange::Outcome::timeout && sockets[i].fd() >= 0) {
        waiting.push_back({sockets[i].fd(), POLLIN, 0});
      }
    }
    if (waiting.empty()) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (::poll(waiting.data(), waiting.size(), static_cast<int>(std::max<long>(left.count(), 0))) <=
        0) {
      continue;
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out[i].outcome != Exchange::Outcome::timeout || sockets[i].fd() < 0) continue;
      char buf[4096];
      const ssize_t got = ::recv(sockets[i].fd(), buf, sizeof(buf), MSG_DONTWAIT);
      if (got > 0) {
        raw[i].append(buf, static_cast<std::size_t>(got));
        if (parse_response(raw[i], out[i], false)) {
          out[i].outcome = Exchange::Outcome::response;
          out[i].ended = Clock::now();
          sockets[i].reset();
        }
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        out[i].outcome = raw[i].empty() ? Exchange::Outcome::reset : Exchange::Outcome::truncated;
        sockets[i].reset();
      }
    }
  }
  return out;
}

// The answers' statuses and how many had each.
std::map<int, int> status_counts(const std::vector<Exchange>& answers) {
  std::map<int, int> counts;
  for (const Exchange& ex : answers) {
    ++counts[ex.outcome == Exchange::Outcome::response ? ex.status : -1];
  }
  return counts;
}

// CPU time (user + system, in clock ticks) of the thread of `pid` named
// `name`, or -1 if there is none.
long thread_cpu_ticks(pid_t pid, const std::string& name) {
  const auto threads =
      thread_values(pid, [](pid_t, const std::string& fields) -> std::optional<int> {
        // state, then fields 4..; utime and stime are fields 14 and 15.
        long utime = 0;
        long stime = 0;
        if (std::sscanf(fields.c_str(), "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld",
                        &utime, &stime) != 2)
          return std::nullopt;
        return static_cast<int>(utime + stime);
      });
  for (const auto& [thread, ticks] : threads)
    if (thread == name) return ticks;
  return -1;
}

// A launcher for Crewd that runs it on the first CPU this test may use.
std::vector<std::string> on_first_cpu() {
  const int cpu = crew::test::first_cpu();
  if (cpu < 0) return {};
  return {"/usr/bin/taskset", "-c", std::to_string(cpu)};
}

// The I/O thread learns that a coroutine job's frame is gone just before
// the worker publishes the job's outcome, and looks again on a timer, not
// in a loop of posts. Such a loop kept the I/O thread on the CPU the
// worker needed: with crewd on one CPU and its jobs workers under
// SCHED_IDLE (which any other crewd thread preempts), the I/O thread spent
// nearly all of it spinning while 16 sleep jobs at a time waited to end,
// and the jobs took a third longer. Bounded by CPU time, not speed: the
// I/O thread's share of the wall time while the jobs run (here 33 % with
// the loop, 1 % without; the bound leaves room for a sanitizer's cost).
TEST(CrewdWaitingJobs, TheIoThreadDoesNotSpinWhileAJobsOutcomeIsPublished) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--http-io-threads", "1", "--jobs-workers", "16",
               "--jobs-max-in-flight", "16", "--jobs-worker-policy", "idle"},
              {}, 0, on_first_cpu());
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  // The I/O threads may start after the port is reported.
  long before = -1;
  for (int i = 0; i < 1000 * kSlowdown && before < 0; ++i) {
    before = thread_cpu_ticks(crewd.pid(), "crewd-io-0");
    if (before < 0) std::this_thread::sleep_for(5ms);
  }
  ASSERT_GE(before, 0) << "no I/O thread found";
  const auto start = Clock::now();
  int ok = 0;
  for (int round = 0; round < 25; ++round) {
    const auto answers =
        post_all(port, R"({"kind":"sleep","ms":20})", 16, Clock::now() + 5s * kSlowdown);
    ok += status_counts(answers)[200];
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  const double io_s = static_cast<double>(thread_cpu_ticks(crewd.pid(), "crewd-io-0") - before) /
                      static_cast<double>(::sysconf(_SC_CLK_TCK));
  EXPECT_EQ(ok, 25 * 16) << crewd.log();
  RecordProperty("io_cpu_share_percent", static_cast<int>(100 * io_s / wall_s));
  EXPECT_LT(io_s, 0.15 * wall_s) << "the I/O thread was on the CPU " << io_s << " s of " << wall_s
                                 << " s";
  expect_clean_stop(crewd);
}

// A thread job's completion reaches the I/O thread just before the worker
// publishes the job's outcome, whose times the answer carries; on one CPU
// the completion's wake-up mostly preempts the worker in between. The I/O
// thread looked again in 16 posts in a row (the worker still off the CPU)
// and then after 1 ms, so most answers came a millisecond late: here a
// median of 1.2 ms from the job's end to its answer, against 0.14-0.16 ms
// with the timer's first look at 20 us. Sequential 1 ms spin jobs, the
// median against a bound of half that millisecond (times kSlowdown).
TEST(CrewdWaitingJobs, AThreadJobIsAnsweredSoonAfterItsOutcomeIsPublished) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--http-io-threads", "1", "--jobs-workers", "1"}, {}, 0,
              on_first_cpu());
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  std::vector<double> late_ms;
  for (int i = 0; i < 60; ++i) {
    const Exchange ex = post(port, "/api/v1/jobs", R"({"kind":"spin","ms":1})");
    ASSERT_EQ(ex.status, 200) << ex.body << crewd.log();
    const Json j = json_of(ex);
    const double crewd_ms = std::chrono::duration<double, std::milli>(ex.ended - ex.sent).count();
    late_ms.push_back(crewd_ms - j["queue_wait_ms"].get<double>() - j["run_ms"].get<double>());
  }
  std::sort(late_ms.begin(), late_ms.end());
  const double median = late_ms[late_ms.size() / 2];
  RecordProperty("answer_after_end_median_us", static_cast<int>(1000 * median));
  EXPECT_LT(median, 0.5 * kSlowdown) << "ms from a job's end to its answer, median; fastest "
                                     << late_ms.front() << ", slowest " << late_ms.back();
  expect_clean_stop(crewd);
}

// Figure 1, smaller: 1,000 sleep jobs of 1 s on 2 workers are all suspended
// at once and all answered 200 within 3 s of the first request.
TEST(CrewdWaitingJobs, AThousandSleepJobsOnTwoWorkersAllEndWithinThreeSeconds) {
  raise_descriptor_limit();
  Crewd crewd({"--listen", "127.0.0.1:0", "--jobs-workers", "2"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  const auto start = Clock::now();
  const auto answers =
      post_all(port, R"({"kind":"sleep","ms":1000})", 1000, start + 3s * kSlowdown);
  const auto counts = status_counts(answers);
  EXPECT_EQ(counts, (std::map<int, int>{{200, 1000}})) << crewd.log();
  Clock::time_point last = start;
  for (const Exchange& ex : answers) last = std::max(last, ex.ended);
  EXPECT_LT(last - start, 3s * kSlowdown);
  for (const Exchange& ex : answers) {
    const Json j = json_of(ex);
    if (ex.status != 200) continue;
    EXPECT_GE(j["run_ms"].get<double>(), 999) << ex.body;
    break;
  }
  expect_clean_stop(crewd);
}

// Starts a crewd whose call jobs GET `url` (more flags after), sends each
// body in turn on its own connection, and stops crewd cleanly: the answers.
std::vector<Exchange> call_jobs(const std::string& url, const std::vector<std::string>& more,
                                const std::vector<std::string>& bodies) {
  std::vector<std::string> args{"--listen", "127.0.0.1:0", "--jobs-call-url", url};
  args.insert(args.end(), more.begin(), more.end());
  Crewd crewd(args);
  std::vector<Exchange> answers;
  const int port = crewd.wait_port();
  EXPECT_GT(port, 0) << crewd.log();
  if (port <= 0) return answers;
  for (const std::string& body : bodies) answers.push_back(post(port, "/api/v1/jobs", body));
  expect_clean_stop(crewd);
  return answers;
}

// A call job waits for the downstream's answer and reports its status,
// whatever it is; no answer is 502 (refused) or 504 (past
// jobs.call_timeout_ms); a job whose own deadline passes first is
// timed_out, and its request is cancelled.
TEST(CrewdWaitingJobs, ACallJobReportsTheDownstreamsStatus) {
  SlowDownstream teapot(50ms, 418);
  auto answers = call_jobs(teapot.url(), {"--jobs-workers", "1"},
                           {R"({"kind":"call","name":"fetch"})", R"({"kind":"call","ms":5})"});
  ASSERT_EQ(answers.size(), 2u);
  ASSERT_EQ(answers[0].status, 200) << answers[0].body;
  Json j = json_of(answers[0]);
  EXPECT_EQ(j["kind"], "call");
  EXPECT_EQ(j["outcome"], "succeeded");
  EXPECT_EQ(j["downstream_status"], 418);
  EXPECT_FALSE(j.contains("ms"));
  EXPECT_GE(j["run_ms"].get<double>(), 45) << answers[0].body;
  EXPECT_EQ(teapot.requests(), 1);
  EXPECT_EQ(answers[1].status, 400) << answers[1].body;

  // Slower than jobs.call_timeout_ms: 504 at that timeout. The job's own
  // deadline first: timed_out, answered at that deadline.
  SlowDownstream slow(5s);
  answers = call_jobs(slow.url(), {"--jobs-call-timeout-ms", "200"},
                      {R"({"kind":"call"})", R"({"kind":"call","timeout_ms":100})"});
  ASSERT_EQ(answers.size(), 2u);
  ASSERT_EQ(answers[0].status, 504) << answers[0].body;
  j = json_of(answers[0]);
  EXPECT_EQ(j["outcome"], "failed");
  EXPECT_EQ(j["reason"], "downstream_timeout");
  EXPECT_LT(answers[0].ended - answers[0].sent, 2s * kSlowdown);
  ASSERT_EQ(answers[1].status, 504) << answers[1].body;
  EXPECT_EQ(json_of(answers[1])["outcome"], "timed_out") << answers[1].body;
  EXPECT_LT(answers[1].ended - answers[1].sent, 1s * kSlowdown);

  // Nobody listening: 502 at once.
  int closed_port = 0;
  {
    SlowDownstream gone(0ms);
    closed_port = gone.port();
  }
  answers = call_jobs("http://127.0.0.1:" + std::to_string(closed_port) + "/none", {},
                      {R"({"kind":"call"})"});
  ASSERT_EQ(answers.size(), 1u);
  ASSERT_EQ(answers[0].status, 502) << answers[0].body;
  j = json_of(answers[0]);
  EXPECT_EQ(j["outcome"], "failed");
  EXPECT_EQ(j["reason"], "downstream_error");
}

// Figure 2, smaller: 200 call jobs against a downstream that answers in
// 1 s, on 2 workers with jobs.max_in_flight = 200, wait together: all
// answered 200 within 3 s of the first request, each one call downstream.
TEST(CrewdWaitingJobs, TwoHundredCallJobsWaitForTheDownstreamTogether) {
  raise_descriptor_limit();
  SlowDownstream slow(1s);
  Crewd crewd({"--listen", "127.0.0.1:0", "--jobs-workers", "2", "--jobs-max-in-flight", "200",
               "--jobs-call-url", slow.url()});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  const auto start = Clock::now();
  const auto answers = post_all(port, R"({"kind":"call"})", 200, start + 3s * kSlowdown);
  EXPECT_EQ(status_counts(answers), (std::map<int, int>{{200, 200}})) << crewd.log();
  EXPECT_EQ(slow.requests(), 200);
  for (const Exchange& ex : answers) {
    EXPECT_EQ(json_of(ex)["downstream_status"], 200) << ex.body;
    if (json_of(ex)["downstream_status"] != 200) break;
  }
  expect_clean_stop(crewd);
}

TEST(CrewdWaitingJobs, ACallJobWithoutACallUrlIs400) {
  Crewd crewd({"--listen", "127.0.0.1:0"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  const Exchange ex = post(port, "/api/v1/jobs", R"({"kind":"call"})");
  EXPECT_EQ(ex.status, 400) << ex.body;
  EXPECT_EQ(json_of(ex)["error"], "kind \"call\" needs a downstream: jobs.call_url is not set");
  expect_clean_stop(crewd);
}

// jobs.max_in_flight counts jobs suspended too: past it a job is refused
// 503 with Retry-After from its head (also with Expect: 100-continue), and
// a slot is free again once a job is answered.
TEST(CrewdWaitingJobs, JobsPastMaxInFlightAre503WithRetryAfter) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--jobs-max-in-flight", "3"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  std::vector<std::thread> holders;
  for (int i = 0; i < 3; ++i) {
    holders.emplace_back([port] {
      const Exchange ex = post(port, "/api/v1/jobs", R"({"kind":"sleep","ms":1500})");
      EXPECT_EQ(ex.status, 200) << ex.body;
    });
  }
  const JoinAll join_all{holders};
  bool held = false;
  for (int i = 0; i < 500 * kSlowdown && !held; ++i) {
    const Json j = Json::parse(get(port, "/api/v1/pools").body, nullptr, false);
    held = j.is_object() && j["pools"][1]["suspended"] == 3;
    if (!held) std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(held) << "the three jobs never waited at once\n" << crewd.log();
  const Exchange refused = post(port, "/api/v1/jobs", R"({"kind":"sleep","ms":1})");
  ASSERT_EQ(refused.status, 503) << refused.body;
  const Json j = json_of(refused);
  EXPECT_EQ(j["reason"], "max_in_flight");
  EXPECT_EQ(j["outcome"], "rejected");
  EXPECT_EQ(refused.header("retry-after"), "1");
  const Exchange asked = send_request(port,
                                      "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nExpect: "
                                      "100-continue\r\nContent-Length: 24\r\n\r\n");
  EXPECT_EQ(asked.status, 503) << asked.body;
  for (auto& t : holders) t.join();
  holders.clear();
  const Exchange again = post(port, "/api/v1/jobs", R"({"kind":"sleep","ms":1})");
  EXPECT_EQ(again.status, 200) << again.body;
  expect_clean_stop(crewd);
}

// A suspended sleep job is listed among the console's running jobs (on no
// worker, with what it waits on) and the console's cancel ends it at once.
TEST(CrewdWaitingJobs, TheConsoleListsAndCancelsASuspendedSleepJob) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--ui-enabled", "true"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  Exchange answer;
  std::vector<std::thread> job;
  const JoinAll join{job};
  job.emplace_back([port, &answer] {
    answer = post(port, "/api/v1/jobs", R"({"kind":"sleep","ms":9000,"name":"napping"})");
  });
  // Listed from its start; suspended in its sleep a moment later, and its
  // deadline known once crewd has recorded the job it spawned.
  Json row;
  Json seen;
  for (int i = 0; i < 500 * kSlowdown && row.is_null(); ++i) {
    const Json s = Json::parse(get(port, "/api/v1/ui/snapshot").body, nullptr, false);
    for (const Json& r : s.is_object() ? s["running"] : Json::array()) {
      if (r["name"] != "napping") continue;
      seen = r;
      if (r["waits_on"] == "sleep" && !r["timeout_ms"].is_null()) row = r;
    }
    if (row.is_null()) std::this_thread::sleep_for(5ms);
  }
  ASSERT_FALSE(row.is_null()) << "the sleep job never showed as suspended in its sleep; last seen: "
                              << seen.dump() << "\n"
                              << crewd.log();
  EXPECT_TRUE(row["worker"].is_null()) << row.dump();
  EXPECT_EQ(row["waits_on"], "sleep") << row.dump();
  EXPECT_EQ(row["state"], "running") << row.dump();
  EXPECT_EQ(row["timeout_ms"], 5000) << row.dump();
  const auto cancelled_at = Clock::now();
  const Exchange cancel = send_request(
      port, request_text("POST",
                         "/api/v1/ui/jobs/" + std::to_string(row["task_id"].get<int>()) + "/cancel",
                         {}, "Sec-Fetch-Site: same-origin\r\n"));
  ASSERT_EQ(cancel.status, 200) << cancel.body;
  EXPECT_EQ(json_of(cancel)["result"], "stop_requested");
  job[0].join();
  EXPECT_EQ(answer.status, 503) << answer.body;
  const Json a = json_of(answer);
  EXPECT_EQ(a["outcome"], "cancelled");
  EXPECT_EQ(a["error"], "the job was cancelled from the console");
  EXPECT_LT(answer.ended - cancelled_at, 1s * kSlowdown);
  expect_clean_stop(crewd);
}

// Figure 3, smaller: SIGTERM with 500 jobs suspended. In drain (jobs of
// 2 s, shutdown.timeout 5 s) every job ends and answers 200; in soft (jobs
// of 10 s) every one is stopped at once and answers 503 with its outcome,
// cancelled, and the pool's report counts them. Either way crewd exits 0
// well within its termination timeout (8 s here).
class CrewdWaitingJobsSigterm : public ::testing::TestWithParam<const char*> {};

TEST_P(CrewdWaitingJobsSigterm, EverySuspendedJobIsAnsweredAndCrewdExitsZero) {
  const bool drain = std::string(GetParam()) == "drain";
  constexpr int kJobs = 500;
  raise_descriptor_limit();
  Crewd crewd({"--listen", "127.0.0.1:0", "--jobs-workers", "2", "--shutdown-mode", GetParam(),
               "--shutdown-timeout-ms", "5000", "--shutdown-termination-timeout-ms", "8000"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  std::vector<Exchange> answers;
  std::vector<std::thread> client;
  const JoinAll join{client};
  client.emplace_back([&] {
    answers =
        post_all(port, drain ? R"({"kind":"sleep","ms":2000})" : R"({"kind":"sleep","ms":10000})",
                 kJobs, Clock::now() + 15s * kSlowdown);
  });
  bool waiting = false;
  for (int i = 0; i < 1000 * kSlowdown && !waiting; ++i) {
    const Json j = Json::parse(get(port, "/api/v1/pools").body, nullptr, false);
    waiting = j.is_object() && j["pools"][1]["suspended"] == kJobs;
    if (!waiting) std::this_thread::sleep_for(2ms);
  }
  crewd.signal(SIGTERM);
  const auto signalled = Clock::now();
  client[0].join();
  ASSERT_TRUE(waiting) << "the jobs never waited at once\n" << crewd.log();
  const auto status = crewd.wait_exit(10s * kSlowdown);
  ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << crewd.log();
  EXPECT_LT(Clock::now() - signalled, 8s);
  EXPECT_EQ(status_counts(answers), (std::map<int, int>{{drain ? 200 : 503, kJobs}}));
  for (const Exchange& ex : answers) {
    const Json j = json_of(ex);
    EXPECT_EQ(j["outcome"], drain ? "succeeded" : "cancelled") << ex.body;
    if (j["outcome"] != (drain ? "succeeded" : "cancelled")) break;
  }
  const std::string report =
      R"(pool jobs stopped \((drain|soft), [^)]*\): .*during the stop succeeded \d+, cancelled (\d+))";
  const std::string log = crewd.full_log();
  const auto m = search(log, report);
  ASSERT_TRUE(m) << log;
  EXPECT_EQ((*m)[2], drain ? "0" : std::to_string(kJobs)) << log;
}

INSTANTIATE_TEST_SUITE_P(Modes, CrewdWaitingJobsSigterm, ::testing::Values("drain", "soft"),
                         [](const auto& mode) { return std::string(mode.param); });

}  // namespace
}  // namespace crewd::test

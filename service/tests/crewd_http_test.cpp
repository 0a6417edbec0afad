// Every route of crewd and every status code it answers with, against a
// crewd process on a free port.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crewd_harness.hpp"
#include "crewd_suite.hpp"
#include "http/responses.hpp"

namespace crewd::test {
namespace {

using Json = nlohmann::json;
using Outcome = Exchange::Outcome;

Json json_of(const Exchange& ex) {
  EXPECT_EQ(ex.header("content-type"), "application/json") << ex.body;
  return Json::parse(ex.body, nullptr, false);
}

// One crewd for the suite; a small body limit and job limits so that the
// error paths are cheap to reach.
class CrewdHttp : public SharedCrewd<CrewdHttp> {
 public:
  static std::vector<std::string> args() {
    return {"--listen",
            "127.0.0.1:0",
            "--http-body-limit",
            "4096",
            "--jobs-max-ms",
            "2000",
            "--jobs-max-timeout-ms",
            "3000",
            "--jobs-default-timeout-ms",
            "2000"};
  }
};

void expect_error(const Exchange& ex, int status, const std::string& message_part) {
  ASSERT_EQ(ex.outcome, Outcome::response) << to_string(ex.outcome);
  EXPECT_EQ(ex.status, status) << ex.body;
  const Json j = json_of(ex);
  ASSERT_TRUE(j.is_object()) << ex.body;
  EXPECT_EQ(j.value("status", 0), status) << ex.body;
  EXPECT_NE(j.value("error", std::string()).find(message_part), std::string::npos) << ex.body;
}

TEST_F(CrewdHttp, FactorialReturnsTheResultAsJson) {
  const Exchange ex = get(port_, "/api/v1/factorial/20");
  ASSERT_EQ(ex.outcome, Outcome::response);
  EXPECT_EQ(ex.status, 200);
  EXPECT_EQ(ex.body, R"({"n":20,"result":2432902008176640000})");
  EXPECT_EQ(json_of(get(port_, "/api/v1/factorial/0"))["result"], 1);
  EXPECT_EQ(json_of(get(port_, "/api/v1/factorial/5"))["result"], 120);
}

TEST_F(CrewdHttp, FactorialRefusesOutOfRangeNegativeAndNonNumericN) {
  for (const char* n : {"21", "-1", "abc", "1.5", "%2B3", "99999999999999999999"}) {
    expect_error(get(port_, std::string("/api/v1/factorial/") + n), 400,
                 "n must be an integer in 0..20");
  }
}

TEST_F(CrewdHttp, JobsRunAndReportTheirOutcomeAndTimings) {
  const Exchange ex =
      post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":50,"timeout_ms":2000,"name":"nap"})");
  ASSERT_EQ(ex.outcome, Outcome::response);
  EXPECT_EQ(ex.status, 200) << ex.body;
  const Json j = json_of(ex);
  EXPECT_EQ(j["outcome"], "succeeded");
  EXPECT_EQ(j["name"], "nap");
  EXPECT_EQ(j["kind"], "sleep");
  // The pool's clock, from the task's handle.
  EXPECT_GE(j["run_ms"].get<double>(), 50.0);
  EXPECT_GE(j["total_ms"].get<double>(), j["run_ms"].get<double>());
  EXPECT_GE(j["queue_wait_ms"].get<double>(), 0.0);
  EXPECT_GE(j["total_ms"].get<double>(),
            j["run_ms"].get<double>() + j["queue_wait_ms"].get<double>());

  const Exchange spin = post(port_, "/api/v1/jobs", R"({"kind":"spin","ms":20})");
  ASSERT_EQ(spin.status, 200) << spin.body;
  EXPECT_EQ(json_of(spin)["outcome"], "succeeded");

  // Every answer has the run's times, also when the answer's completion
  // reaches the I/O thread before the pool has recorded them.
  for (int i = 0; i < 30; ++i) {
    const Exchange short_job = post(port_, "/api/v1/jobs", R"({"kind":"spin","ms":2})");
    ASSERT_EQ(short_job.status, 200) << short_job.body;
    EXPECT_GE(json_of(short_job)["run_ms"].get<double>(), 2.0)
        << "job " << i << ": " << short_job.body;
  }
}

// X-Request-Id: taken when valid, made when absent, returned on every
// response; it becomes the job's correlation id (shown in the job's JSON
// and the pools' worker list) and never a metric label.
TEST_F(CrewdHttp, ARequestIdIsTakenOrMadeReturnedAndGivenToTheTask) {
  const Exchange ex =
      send_request(port_, request_text("POST", "/api/v1/jobs", R"({"kind":"sleep","ms":1})",
                                       "X-Request-Id: req-abc-123\r\n"));
  ASSERT_EQ(ex.status, 200) << ex.body;
  EXPECT_EQ(ex.header("x-request-id"), "req-abc-123");
  EXPECT_EQ(json_of(ex)["request_id"], "req-abc-123");

  const Exchange a = get(port_, "/healthz");
  const Exchange b = get(port_, "/healthz");
  EXPECT_FALSE(a.header("x-request-id").empty());
  EXPECT_NE(a.header("x-request-id"), b.header("x-request-id"));
  const Exchange made = post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":1})");
  ASSERT_EQ(made.status, 200) << made.body;
  EXPECT_EQ(json_of(made)["request_id"], made.header("x-request-id"));

  for (const std::string& bad : {std::string(65, 'x'), std::string("a b")}) {
    const Exchange refused =
        send_request(port_, request_text("GET", "/healthz", {}, "X-Request-Id: " + bad + "\r\n"));
    expect_error(refused, 400, "X-Request-Id");
    EXPECT_EQ(refused.header("x-request-id"), "");
  }

  // A running job shows its id in the worker list.
  std::thread slow([port = port_] {
    (void)send_request(port, request_text("POST", "/api/v1/jobs", R"({"kind":"sleep","ms":600})",
                                          "X-Request-Id: req-slow-1\r\n"));
  });
  bool shown = false;
  for (int i = 0; i < 200 && !shown; ++i) {
    shown =
        get(port_, "/api/v1/pools").body.find(R"("request_id":"req-slow-1")") != std::string::npos;
    if (!shown) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  slow.join();
  EXPECT_TRUE(shown);
  EXPECT_EQ(get(port_, "/metrics").body.find("req-"), std::string::npos);
}

TEST_F(CrewdHttp, AJobPastItsDeadlineIs504) {
  for (const char* kind : {"sleep", "spin"}) {
    const Exchange ex =
        post(port_, "/api/v1/jobs",
             std::string(R"({"kind":")") + kind + R"(","ms":1500,"timeout_ms":50})");
    ASSERT_EQ(ex.outcome, Outcome::response);
    EXPECT_EQ(ex.status, 504) << ex.body;
    const Json j = json_of(ex);
    EXPECT_EQ(j["outcome"], "timed_out");
    EXPECT_LT(j["run_ms"].get<double>(), 1000.0) << "the deadline stopped the job";
  }
}

TEST_F(CrewdHttp, JobsRefuseMalformedJsonAndBadValues) {
  expect_error(post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":)"), 400, "not valid JSON");
  expect_error(post(port_, "/api/v1/jobs", ""), 400, "not valid JSON");
  expect_error(post(port_, "/api/v1/jobs", "[1,2]"), 400, "must be a JSON object");
  expect_error(post(port_, "/api/v1/jobs", R"({"kind":"nap","ms":1})"), 400, "kind must be");
  expect_error(post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":-5})"), 400,
               "ms must be an integer in 0..2000");
  expect_error(post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":"fast"})"), 400,
               "ms must be an integer in 0..2000");
  expect_error(post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":2001})"), 400,
               "ms must be an integer in 0..2000");
  expect_error(post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":1,"timeout_ms":0})"), 400,
               "timeout_ms must be an integer in 1..3000");
  expect_error(post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":1,"extra":true})"), 400,
               "unknown field 'extra'");
}

TEST_F(CrewdHttp, ABodyOverTheLimitIs413) {
  const std::string big = R"({"kind":"sleep","ms":1,"name":")" + std::string(5000, 'x') + "\"}";
  expect_error(post(port_, "/api/v1/jobs", big), 413, "http.body_limit (4096 bytes)");
  // Chunked, so that no Content-Length announces it.
  std::string chunked =
      "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 10; ++i) chunked += "400\r\n" + std::string(1024, 'a') + "\r\n";
  chunked += "0\r\n\r\n";
  expect_error(send_request(port_, chunked), 413, "http.body_limit");
  // The service is fine afterwards.
  EXPECT_EQ(get(port_, "/healthz").status, 200);
}

TEST_F(CrewdHttp, UnknownRoutesAre404) {
  for (const char* path : {"/", "/api/v1", "/api/v1/factorial", "/api/v1/factorial/",
                           "/api/v1/factorial/3/4", "/healthz/", "/api/v2/jobs", "/metricsx"}) {
    expect_error(get(port_, path), 404, "no such route");
  }
}

TEST_F(CrewdHttp, WrongMethodsAre405WithAllow) {
  struct Case {
    const char* method;
    const char* path;
    const char* allow;
  };
  for (const Case c :
       {Case{"POST", "/api/v1/factorial/3", "GET, HEAD"}, Case{"GET", "/api/v1/jobs", "POST"},
        Case{"DELETE", "/api/v1/jobs", "POST"}, Case{"PUT", "/metrics", "GET, HEAD"},
        Case{"POST", "/healthz", "GET, HEAD"}, Case{"POST", "/api/v1/pools", "GET, HEAD"}}) {
    const Exchange ex =
        send_request(port_, request_text(c.method, c.path, c.method[0] == 'G' ? "" : "{}"));
    expect_error(ex, 405, "method not allowed");
    EXPECT_EQ(ex.header("allow"), c.allow) << c.method << " " << c.path;
  }
}

TEST_F(CrewdHttp, AMalformedRequestIs400) {
  const Exchange ex = send_request(port_, "NOT-HTTP\r\n\r\n");
  ASSERT_EQ(ex.outcome, Outcome::response) << to_string(ex.outcome);
  EXPECT_EQ(ex.status, 400);
}

// RFC 9112 section 2.2: empty lines before the request line are ignored
// (up to four; a client sending an endless run of them gets 400), whether
// they come first, split across reads, or after a body on a kept-alive
// connection.
TEST_F(CrewdHttp, EmptyLinesBeforeTheRequestLineAreIgnored) {
  const std::string get3 = "GET /api/v1/factorial/3 HTTP/1.1\r\nHost: x\r\n\r\n";
  const Exchange first = send_request(port_, "\r\n" + request_text("GET", "/healthz"));
  ASSERT_EQ(first.outcome, Outcome::response) << to_string(first.outcome);
  EXPECT_EQ(first.status, 200);

  Socket s = connect_to(port_);
  ASSERT_GE(s.fd(), 0);
  int err = 0;
  const std::string job = R"({"kind":"sleep","ms":0})";
  ASSERT_TRUE(write_all(s.fd(),
                        "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                            std::to_string(job.size()) + "\r\n\r\n" + job + "\r\n",
                        err));
  Exchange posted;
  read_response(s.fd(), posted, Clock::now() + 5s * kSlowdown);
  ASSERT_EQ(posted.outcome, Outcome::response);
  EXPECT_EQ(posted.status, 200) << posted.body;
  // A lone CR, then its LF and the request in a later segment.
  ASSERT_TRUE(write_all(s.fd(), "\r", err));
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(write_all(s.fd(), "\n\r\n" + get3, err));
  Exchange after;
  read_response(s.fd(), after, Clock::now() + 5s * kSlowdown);
  ASSERT_EQ(after.outcome, Outcome::response);
  EXPECT_EQ(after.status, 200);
  EXPECT_EQ(after.body, R"({"n":3,"result":6})");

  std::string many;
  for (int i = 0; i < 5; ++i) many += "\r\n";
  const Exchange too_many = send_request(port_, many + request_text("GET", "/healthz"));
  ASSERT_EQ(too_many.outcome, Outcome::response) << to_string(too_many.outcome);
  EXPECT_EQ(too_many.status, 400);
}

TEST_F(CrewdHttp, HealthAndReadiness) {
  const Exchange h = get(port_, "/healthz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(json_of(h)["status"], "ok");
  const Exchange r = get(port_, "/readyz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json_of(r)["status"], "ready");
  const Exchange head = send_request(port_, request_text("HEAD", "/healthz"));
  ASSERT_EQ(head.outcome, Outcome::response);
  EXPECT_EQ(head.status, 200);
}

TEST_F(CrewdHttp, KeepAliveServesSeveralRequestsOnOneConnection) {
  Socket s = connect_to(port_);
  ASSERT_GE(s.fd(), 0);
  for (int i = 0; i < 3; ++i) {
    int err = 0;
    ASSERT_TRUE(write_all(s.fd(), "GET /api/v1/factorial/3 HTTP/1.1\r\nHost: x\r\n\r\n", err));
    Exchange ex;
    read_response(s.fd(), ex, Clock::now() + 5s * kSlowdown);
    ASSERT_EQ(ex.outcome, Outcome::response);
    EXPECT_EQ(ex.body, R"({"n":3,"result":6})");
  }
}

TEST_F(CrewdHttp, PoolsShowStatsAndWorkersOfEveryPool) {
  // Jobs running meanwhile show up in the jobs pool: a spin job in its
  // worker list, a sleep job (a coroutine task, on no worker while it
  // waits) in its suspended list.
  std::thread spin([port = port_] {
    (void)post(port, "/api/v1/jobs", R"({"kind":"spin","ms":1000,"name":"visible-job"})");
  });
  std::thread sleep([port = port_] {
    (void)post(port, "/api/v1/jobs", R"({"kind":"sleep","ms":1000,"name":"waiting-job"})");
  });
  bool seen = false;
  bool seen_waiting = false;
  Json j;
  for (int i = 0; i < 200 * kSlowdown && !(seen && seen_waiting); ++i) {
    const Exchange ex = get(port_, "/api/v1/pools");
    ASSERT_EQ(ex.status, 200);
    j = json_of(ex);
    for (const auto& p : j["pools"]) {
      if (p["name"] != "jobs") continue;
      for (const auto& w : p["worker_list"]) {
        if (w.contains("task") && w["task"]["name"] == "visible-job") {
          EXPECT_EQ(w["state"], "busy");
          seen = true;
        }
      }
      for (const auto& c : p["suspended_list"]) {
        if (c["task"]["name"] == "waiting-job") {
          EXPECT_EQ(c["waits_on"], "sleep");
          EXPECT_GE(p["suspended"].get<int>(), 1);
          EXPECT_GE(p["coroutines"].get<int>(), 1);
          seen_waiting = true;
        }
      }
    }
    if (!(seen && seen_waiting)) std::this_thread::sleep_for(5ms);
  }
  spin.join();
  sleep.join();
  EXPECT_TRUE(seen) << j.dump(2);
  EXPECT_TRUE(seen_waiting) << j.dump(2);
  std::vector<std::string> names;
  for (const auto& p : j["pools"]) {
    names.push_back(p["name"]);
    for (const char* key :
         {"state", "workers", "idle", "busy", "max_workers", "queued", "submitted", "outcomes",
          "helped", "worker_list", "coroutines", "suspended", "suspended_list"}) {
      EXPECT_TRUE(p.contains(key)) << key;
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"compute", "jobs"}));
  EXPECT_EQ(j["halting"], false);
  // The I/O threads that serve connections (no pool: a connection takes no thread).
  EXPECT_GE(j["http"]["io_threads"].get<int>(), 1);
  EXPECT_GE(j["http"]["connections"].get<int>(), 1);
  EXPECT_GE(j["http"]["max_connections"].get<int>(), 1);
}

// crewd counts a request before it sends the response, so the response's
// client finds it counted. The pool counts a task once the task has
// returned, just after it handed its completion to the I/O thread: the
// crew_* lines are checked once /api/v1/pools shows the task counted.
TEST_F(CrewdHttp, MetricsCoverPoolsRequestsAndTheProcess) {
  ASSERT_EQ(get(port_, "/api/v1/factorial/7").status, 200);
  for (int i = 0; i < 1000 * kSlowdown; ++i) {
    const Json j = json_of(get(port_, "/api/v1/pools"));
    if (j["pools"][0]["outcomes"]["succeeded"].get<std::uint64_t>() > 0) break;
    std::this_thread::sleep_for(1ms);
  }
  const Exchange ex = get(port_, "/metrics");
  ASSERT_EQ(ex.status, 200);
  EXPECT_EQ(ex.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  std::vector<std::string> lines = {
      "crewd_http_requests_total{route=\"/api/v1/factorial/{n}\",status=\"200\"}",
      "crewd_http_request_duration_seconds_bucket{route=\"/api/v1/factorial/"
      "{n}\",status=\"200\",le=\"+Inf\"}",
      "crewd_http_connections ",
      "crewd_http_connections_closed_total{reason=\"idle_timeout\"}",
      "process_cpu_seconds_total ",
      "process_resident_memory_bytes ",
      "process_open_fds ",
      "process_max_fds ",
      "process_threads ",
      "process_start_time_seconds ",
      "crewd_usable_cpus "};
#if CREWD_CREW_METRICS
  for (const char* line :
       {"crew_tasks_total{pool=\"compute\",task=\"factorial\",outcome=\"succeeded\"}",
        "crew_workers{pool=\"compute\",state=\"busy\"}", "crew_queue_length{pool=\"jobs\"}"}) {
    lines.emplace_back(line);
  }
#endif
  for (const std::string& line : lines) {
    EXPECT_NE(ex.body.find(line), std::string::npos) << line << " missing";
  }
}

// Fills a crewd started with one job worker and a queue of one: one job
// running and one queued, each a 600 ms sleep answered 200 on `holders`.
// False if the pool never got there (bounded).
bool hold_jobs_pool(int port, std::vector<std::thread>& holders) {
  // Waits until the jobs pool has `busy` running and `queued` queued.
  const auto wait_for_jobs = [port](int busy, int queued) {
    for (int i = 0; i < 500 * kSlowdown; ++i) {
      const Json j = Json::parse(get(port, "/api/v1/pools").body, nullptr, false);
      if (j.is_object() && j["pools"][1]["busy"] == busy && j["pools"][1]["queued"] == queued) {
        return true;
      }
      std::this_thread::sleep_for(2ms);
    }
    return false;
  };
  // One after the other: the second must find the first running, not still
  // queued (the queue holds one). Stuck jobs: each holds the worker while
  // it runs (a sleep job would wait without it).
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([port] {
      const Exchange ex = post(port, "/api/v1/jobs", R"({"kind":"stuck","ms":600})");
      EXPECT_EQ(ex.status, 200) << ex.body;
    });
    if (!wait_for_jobs(1, i)) return false;
  }
  return true;
}

// Starts `crewd` (one job worker, a queue of one, then `more` flags) and
// fills its jobs pool (hold_jobs_pool); the port, or 0 on failure (the
// test has failed then).
int start_and_hold(std::optional<Crewd>& crewd, const std::vector<std::string>& more,
                   std::vector<std::thread>& holders) {
  std::vector<std::string> args{"--listen",     "127.0.0.1:0", "--jobs-workers",     "1",
                                "--jobs-queue", "1",           "--jobs-allow-stuck", "true"};
  args.insert(args.end(), more.begin(), more.end());
  crewd.emplace(args);
  const int port = crewd->wait_port();
  if (port <= 0) {
    ADD_FAILURE() << crewd->log();
    return 0;
  }
  if (!hold_jobs_pool(port, holders)) {
    ADD_FAILURE() << "the jobs pool never had one job running and one queued\n" << crewd->log();
    return 0;
  }
  return port;
}

// Its own crewd: one job worker and a queue of one, to fill them (the
// overload controller off: this is the full queue's answer).
TEST(CrewdHttpFull, AJobThePoolCannotTakeIs503) {
  std::optional<Crewd> crewd;  // outlives the holders: they are joined first
  std::vector<std::thread> holders;
  const JoinAll join_all{holders};
  const int port = start_and_hold(crewd, {"--jobs-overload", "false"}, holders);
  if (port == 0) return;
  const Exchange ex = post(port, "/api/v1/jobs", R"({"kind":"sleep","ms":1})");
  ASSERT_EQ(ex.outcome, Outcome::response);
  EXPECT_EQ(ex.status, 503) << ex.body;
  const Json j = json_of(ex);
  EXPECT_EQ(j["outcome"], "rejected");
  EXPECT_EQ(ex.header("retry-after"), "1");
  // A client that asks before sending its body is told at once, without a
  // 100 Continue first.
  const std::string body = R"({"kind":"sleep","ms":1})";
  const Exchange asked =
      send_request(port,
                   "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                   "Content-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n");
  ASSERT_EQ(asked.outcome, Outcome::response);
  EXPECT_EQ(asked.status, 503) << "no 100 Continue first: " << asked.body;
  EXPECT_EQ(asked.header("retry-after"), "1");
  EXPECT_EQ(asked.header("connection"), "close");
  for (auto& t : holders) t.join();
}

// Its own crewd with the overload controller on (the default): one job
// worker and a queue of one make a limit of 2 admitted jobs (its floor and
// ceiling). A third job is refused from its head: 503 with a JSON body
// naming the pool and the reason, a Retry-After, and the connection stays
// open for the next request; /healthz and /metrics still answer. The
// target is long so that CoDel does not shed the queued holder (its first
// interval may have only the first job's wait, which includes starting
// the worker thread).
TEST(CrewdHttpOverload, AJobPastTheLimitIs503FromItsHeadAndTheConnectionStaysOpen) {
  std::optional<Crewd> crewd;  // outlives the holders: they are joined first
  std::vector<std::thread> holders;
  const JoinAll join_all{holders};
  const int port = start_and_hold(crewd, {"--jobs-overload-target-ms", "10000"}, holders);
  if (port == 0) return;
  const std::string body = R"({"kind":"sleep","ms":1})";
  Socket s = connect_to(port);
  ASSERT_GE(s.fd(), 0);
  int err = 0;
  ASSERT_TRUE(write_all(s.fd(),
                        "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body,
                        err));
  const auto deadline = Clock::now() + 10s * kSlowdown;
  std::string raw;
  Exchange refused;
  read_response(s.fd(), raw, refused, deadline, false);
  ASSERT_EQ(refused.outcome, Outcome::response);
  EXPECT_EQ(refused.status, 503) << refused.body;
  const Json j = json_of(refused);
  EXPECT_EQ(j["pool"], "jobs") << refused.body;
  EXPECT_EQ(j["reason"], "limit") << refused.body;
  EXPECT_EQ(j["outcome"], "rejected") << refused.body;
  const std::string retry = refused.header("retry-after");
  EXPECT_TRUE(retry == "1" || retry == "2") << "Retry-After: " << retry;
  EXPECT_EQ(refused.header("connection"), "");
  // The same connection serves the next request.
  raw.clear();  // nothing follows the response: no request was pipelined
  ASSERT_TRUE(write_all(s.fd(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", err));
  Exchange next;
  read_response(s.fd(), raw, next, deadline, false);
  ASSERT_EQ(next.outcome, Outcome::response);
  EXPECT_EQ(next.status, 200) << next.body;
  // /metrics bypasses the controller and shows its limit.
  const Exchange m = get(port, "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("crew_admission_limit{pool=\"jobs\"} 2"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("crew_tasks_shed_total{pool=\"jobs\",reason=\"limit\"} 1"),
            std::string::npos)
      << m.body;
  for (auto& t : holders) t.join();
}

// Every `reason` a job's 503/504 body can carry for a task's crew::Error is
// a snake_case token, the one docs/crewd.md lists ("Reasons").
TEST(CrewdHttpReasons, AreTheDocumentedTokens) {
  using crew::Admission;
  using crew::Errc;
  using crew::Error;
  using crew::OverloadReason;
  const std::vector<std::pair<Error, std::string>> cases = {
      {Error(Errc::expired, "x"), "expired"},
      {Error(Errc::shutdown_dropped, "x"), "shutdown_dropped"},
      {Error(Errc::cancelled, "x"), "cancelled"},
      {Error(Errc::timed_out, "x"), "timed_out"},
      {Error(Errc::abandoned, "x"), "abandoned"},
      {Error(Errc::stack_exhausted, "x"), "stack_exhausted"},
      {Error(Errc::rejected, "x", Admission::full), "full"},
      {Error(Errc::rejected, "x", Admission::closed), "closed"},
      {Error(Errc::rejected, "x", Admission::too_many_blocked), "too_many_blocked"},
      {Error(Errc::rejected, "x", Admission::overloaded, OverloadReason::limit), "limit"},
      {Error(Errc::rejected, "x", Admission::overloaded, OverloadReason::deadline), "deadline"},
      {Error(Errc::rejected, "x", Admission::overloaded, OverloadReason::rate), "rate"},
      {Error(Errc::overloaded, "x", Admission::accepted, OverloadReason::codel), "codel"},
      {Error(Errc::overloaded, "x", Admission::accepted, OverloadReason::priority), "priority"},
  };
  for (const auto& [error, token] : cases) {
    EXPECT_EQ(http::reason_of(error), token) << crew::to_string(error.code());
  }
}

// Its own crewd: one job worker, busy with a long job that holds it. The
// next job's queue deadline answers it at that deadline, not when the
// worker is free again: a thread job (the pool's supervisor expires it) and
// a coroutine job (its start waits in the queue; crewd's timer answers it).
class CrewdHttpQueueDeadline : public ::testing::TestWithParam<const char*> {};

TEST_P(CrewdHttpQueueDeadline, AJobPastItsQueueDeadlineIs503AtTheDeadline) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--jobs-workers", "1", "--jobs-queue-timeout-ms", "500",
               "--jobs-allow-stuck", "true"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  std::thread holder([port] {
    const Exchange ex = post(port, "/api/v1/jobs", R"({"kind":"stuck","ms":3000})");
    EXPECT_EQ(ex.status, 200) << ex.body;
  });
  struct Join {
    std::thread& t;
    ~Join() { t.join(); }
  } join{holder};
  bool running = false;
  for (int i = 0; i < 500 * kSlowdown && !running; ++i) {
    const Json j = Json::parse(get(port, "/api/v1/pools").body, nullptr, false);
    running = j.is_object() && j["pools"][1]["busy"] == 1;
    if (!running) std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(running) << "the first job never ran\n" << crewd.log();
  const Exchange ex =
      post(port, "/api/v1/jobs", std::string(R"({"kind":")") + GetParam() + R"(","ms":10})");
  ASSERT_EQ(ex.outcome, Outcome::response);
  EXPECT_EQ(ex.status, 503) << ex.body;
  const Json j = json_of(ex);
  EXPECT_EQ(j["outcome"], "rejected");
  EXPECT_EQ(j["reason"], "expired");
  EXPECT_GE(j["queue_wait_ms"].get<double>(), 450) << ex.body;
  EXPECT_FALSE(j.contains("run_ms")) << ex.body;
  // Well before the first job ends (3 s), even under a sanitizer.
  EXPECT_LT(ex.ended - ex.sent, kSlowdown > 1 ? 2000ms : 800ms)
      << "answered when the worker was free";
}

INSTANTIATE_TEST_SUITE_P(Kinds, CrewdHttpQueueDeadline, ::testing::Values("spin", "sleep"),
                         [](const auto& p) { return std::string(p.param); });

}  // namespace
}  // namespace crewd::test

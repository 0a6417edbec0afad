// Priorities in crewd: a job request's X-Priority and X-Deadline-Ms, read
// from its head (docs/crewd.md, "Priority and deadline"), the jobs
// workers' scheduling priority below the I/O threads (jobs.worker_nice,
// jobs.worker_policy) and the I/O threads' own (http.io_slice_us,
// http.io_policy).
// Each test runs its own crewd; every wait is bounded.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "affinity.hpp"  // may_use_fifo
#include "crewd_harness.hpp"
#include "crewd_suite.hpp"

namespace crewd::test {
namespace {

using Json = nlohmann::json;

Json json_of(const Exchange& ex) { return Json::parse(ex.body, nullptr, false); }

Exchange post_job(int port, const std::string& body, const std::string& headers) {
  return send_request(port, request_text("POST", "/api/v1/jobs", body, headers));
}

// Polls GET /api/v1/pools until pool jobs has `busy` workers and `queued`
// jobs in its queue, for at most 5 s (scaled).
bool wait_for_jobs(int port, int busy, int queued) {
  for (int i = 0; i < 2500 * kSlowdown; ++i) {
    const Json j = json_of(get(port, "/api/v1/pools"));
    if (j.is_object() && j["pools"][1]["busy"] == busy && j["pools"][1]["queued"] == queued)
      return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

TEST(CrewdJobHeaders, BadValuesAre400NamingTheHeaderBeforeTheBodyIsSent) {
  Crewd crewd({"--listen", "127.0.0.1:0"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  const std::string body = R"({"kind":"sleep","ms":1})";
  for (const auto& [header, value] :
       std::vector<std::pair<std::string, std::string>>{{"X-Priority", "urgent"},
                                                        {"X-Priority", "3"},
                                                        {"X-Priority", ""},
                                                        {"X-Deadline-Ms", "0"},
                                                        {"X-Deadline-Ms", "-5"},
                                                        {"X-Deadline-Ms", "5ms"},
                                                        {"X-Deadline-Ms", "60001"}}) {
    SCOPED_TRACE(header + ": " + value);
    const Exchange ex = post_job(port, body, header + ": " + value + "\r\n");
    ASSERT_EQ(ex.status, 400) << ex.body;
    const Json j = json_of(ex);
    EXPECT_EQ(j["header"], header);
    EXPECT_EQ(j["error"].get<std::string>().rfind(header + " must be", 0), 0u) << ex.body;
  }
  // With Expect: 100-continue the 400 comes instead of 100 Continue: the
  // client never sends its body.
  const Exchange asked =
      send_request(port,
                   "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nX-Priority: top\r\nExpect: "
                   "100-continue\r\nContent-Length: 24\r\n\r\n");
  EXPECT_EQ(asked.status, 400) << asked.body;
  EXPECT_EQ(json_of(asked)["header"], "X-Priority");
  // Good values, in any case, and the level numbers.
  for (const std::string h : {"X-Priority: HIGH\r\n", "X-Priority: low\r\n", "X-Priority: 1\r\n",
                              "X-Deadline-Ms: 1000\r\nX-Priority: Normal\r\n"}) {
    const Exchange ok = post_job(port, body, h);
    EXPECT_EQ(ok.status, 200) << h << ok.body;
  }
  expect_clean_stop(crewd);
}

// One worker busy with a 3 s job (long enough for the three low jobs and
// the high one to arrive on a loaded machine), three low jobs queued,
// then a high one: the high one runs first. Each job spins 300 ms, so the high one
// ends at least 300 ms before any low one; the ends are compared as the
// client's send time plus crewd's total_ms (the arrival to the answer),
// which is off by the send's delay only. The controller is off so that no
// job is shed meanwhile.
TEST(CrewdJobHeaders, AHighPriorityJobRunsBeforeQueuedLowOnes) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--jobs-workers", "1", "--jobs-overload", "false"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  std::vector<std::thread> clients;
  const JoinAll join_all{clients};
  clients.emplace_back([port] {
    const Exchange ex = post_job(port, R"({"kind":"spin","ms":3000,"name":"blocker"})", "");
    EXPECT_EQ(ex.status, 200) << ex.body;
  });
  ASSERT_TRUE(wait_for_jobs(port, 1, 0)) << crewd.log();
  std::vector<Exchange> low(3);
  for (std::size_t i = 0; i < low.size(); ++i) {
    clients.emplace_back([port, &ex = low[i]] {
      ex = post_job(port, R"({"kind":"spin","ms":300,"name":"low"})", "X-Priority: low\r\n");
    });
  }
  ASSERT_TRUE(wait_for_jobs(port, 1, 3)) << crewd.log();
  const Exchange high =
      post_job(port, R"({"kind":"spin","ms":300,"name":"high"})", "X-Priority: high\r\n");
  for (auto& t : clients) t.join();
  clients.clear();
  const auto end = [](const Exchange& ex) {
    return ex.sent +
           std::chrono::duration_cast<Clock::duration>(
               std::chrono::duration<double, std::milli>(json_of(ex)["total_ms"].get<double>()));
  };
  ASSERT_EQ(high.status, 200) << high.body;
  for (const Exchange& ex : low) {
    ASSERT_EQ(ex.status, 200) << ex.body;
    EXPECT_LT(end(high), end(ex)) << ex.body << high.body;
  }
  expect_clean_stop(crewd);
}

// X-Deadline-Ms is the job's queue deadline when it comes before
// jobs.queue_timeout_ms: behind a 3 s job on the one worker, a job with a
// 100 ms deadline is answered 503 at that deadline, long before the 3 s
// (the bound leaves 1.4 s for a loaded machine).
TEST(CrewdJobHeaders, AJobNotStartedByItsDeadlineIs503AtTheDeadline) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--jobs-workers", "1", "--jobs-overload", "false"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  std::vector<std::thread> blocker;
  const JoinAll join{blocker};
  blocker.emplace_back([port] {
    const Exchange ex = post_job(port, R"({"kind":"spin","ms":3000})", "");
    EXPECT_EQ(ex.status, 200) << ex.body;
  });
  ASSERT_TRUE(wait_for_jobs(port, 1, 0)) << crewd.log();
  const Exchange late = post_job(port, R"({"kind":"spin","ms":1})", "X-Deadline-Ms: 100\r\n");
  blocker[0].join();
  ASSERT_EQ(late.status, 503) << late.body;
  EXPECT_EQ(json_of(late)["reason"], "expired") << late.body;
  const auto waited = late.ended - late.sent;
  EXPECT_GE(waited, 90ms);
  EXPECT_LT(waited, 100ms + 1400ms * kSlowdown)
      << "answered at the 3 s job's end, not its deadline";
  expect_clean_stop(crewd);
}

// Each thread of `pid` as (name, nice).
std::vector<std::pair<std::string, int>> thread_nices(pid_t pid) {
  return thread_values(pid, [](pid_t, const std::string& fields) -> std::optional<int> {
    // state, then fields 4..; nice is field 19.
    int nice = 0;
    if (std::sscanf(fields.c_str(),
                    "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %d",
                    &nice) != 1)
      return std::nullopt;
    return nice;
  });
}

// Each thread of `pid` as (name, scheduling policy: SCHED_*).
std::vector<std::pair<std::string, int>> thread_policies(pid_t pid) {
  return thread_values(pid, [](pid_t tid, const std::string&) -> std::optional<int> {
    const int policy = ::sched_getscheduler(tid);
    if (policy < 0) return std::nullopt;
    return policy;
  });
}

// The time slice Linux's EEVDF scheduler gives thread `tid` of `pid` (0:
// the process's main thread), in nanoseconds: se.slice in its sched file
// under /proc, shown since Linux 6.13.
std::optional<int> slice_of(pid_t pid, pid_t tid) {
  std::string path = "/proc/" + std::to_string(pid);
  if (tid != 0) path += "/task/" + std::to_string(tid);
  std::FILE* f = std::fopen((path + "/sched").c_str(), "r");
  if (f == nullptr) return std::nullopt;
  char line[256];
  std::optional<int> slice;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long ns = 0;
    if (std::sscanf(line, "se.slice : %lld", &ns) == 1) slice = static_cast<int>(ns);
  }
  std::fclose(f);
  return slice;
}

// Each thread of `pid` as (name, time slice in ns).
std::vector<std::pair<std::string, int>> thread_slices(pid_t pid) {
  return thread_values(pid, [pid](pid_t tid, const std::string&) { return slice_of(pid, tid); });
}

// Whether `name` is a jobs worker's ("jobs-3") or an I/O thread's.
bool is_jobs_worker(const std::string& name) { return name.rfind("jobs-", 0) == 0; }
bool is_io_thread(const std::string& name) { return name.rfind("crewd-io-", 0) == 0; }

// A crewd with 3 jobs workers and 2 I/O threads, started with `flags`:
// each jobs worker's value (as `threads_of` reads them) is `worker`, each
// I/O thread's `io`. The workers set theirs on themselves as they start,
// and the I/O threads may start after the port is reported: it waits
// (bounded) for all five.
void expect_thread_values(const std::vector<std::string>& flags,
                          std::vector<std::pair<std::string, int>> (*threads_of)(pid_t), int worker,
                          int io_value) {
  std::vector<std::string> args = {"--listen", "127.0.0.1:0",       "--jobs-workers",
                                   "3",        "--http-io-threads", "2"};
  args.insert(args.end(), flags.begin(), flags.end());
  Crewd crewd(args);
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  std::vector<std::pair<std::string, int>> threads;
  for (int i = 0; i < 1000 * kSlowdown; ++i) {
    threads = threads_of(crewd.pid());
    const auto workers = std::count_if(threads.begin(), threads.end(), [&](const auto& t) {
      return is_jobs_worker(t.first) && t.second == worker;
    });
    const auto io = std::count_if(threads.begin(), threads.end(),
                                  [](const auto& t) { return is_io_thread(t.first); });
    if (workers == 3 && io == 2) break;
    std::this_thread::sleep_for(5ms);
  }
  int workers = 0;
  int io = 0;
  for (const auto& [name, value] : threads) {
    if (is_jobs_worker(name)) {
      ++workers;
      EXPECT_EQ(value, worker) << name;
    } else if (is_io_thread(name)) {
      ++io;
      EXPECT_EQ(value, io_value) << name;
    }
  }
  EXPECT_EQ(workers, 3);
  EXPECT_EQ(io, 2);
  expect_clean_stop(crewd);
}

// jobs.worker_nice: every jobs worker runs that many nice steps above
// crewd's main and I/O threads (at most 19), 3 by default; 0 leaves them
// level.
TEST(CrewdWorkerNice, JobsWorkersRunBelowTheIoThreads) {
  const int base = ::getpriority(PRIO_PROCESS, 0);  // crewd inherits it
  for (const auto& [flags, steps] : std::vector<std::pair<std::vector<std::string>, int>>{
           {{"--jobs-worker-nice", "7"}, 7}, {{"--jobs-worker-nice", "0"}, 0}, {{}, 3}}) {
    SCOPED_TRACE("jobs.worker_nice " + std::to_string(steps));
    expect_thread_values(flags, thread_nices, std::min(19, base + steps), base);
  }
}

// jobs.worker_policy: every jobs worker runs with that policy, the I/O
// threads with SCHED_OTHER (batch is crew's PoolOptions::worker_policy, idle
// crewd's own start hook).
TEST(CrewdWorkerPolicy, JobsWorkersSetItAndTheIoThreadsDoNot) {
  for (const auto& [name, want] : std::vector<std::pair<std::string, int>>{
           {"idle", SCHED_IDLE}, {"batch", SCHED_BATCH}, {"normal", SCHED_OTHER}}) {
    SCOPED_TRACE("jobs.worker_policy " + name);
    expect_thread_values({"--jobs-worker-policy", name}, thread_policies, want, SCHED_OTHER);
  }
}

// http.io_slice_us: each I/O thread asks Linux for that time slice, so
// that it preempts a busy jobs worker when it wakes; the jobs workers,
// which an I/O thread may start, keep theirs (here the system's: the
// test's own, which crewd inherits). 0 leaves the I/O threads at the
// system's too.
TEST(CrewdIoSlice, IoThreadsAskForTheirSliceAndJobsWorkersDoNot) {
  const std::optional<int> base = slice_of(::getpid(), 0);
  if (!base) GTEST_SKIP() << "this kernel shows no per-thread slice (se.slice, Linux 6.13+)";
  for (const auto& [flag, io] : std::vector<std::pair<std::string, int>>{
           {"100", 100'000}, {"2500", 2'500'000}, {"0", *base}}) {
    SCOPED_TRACE("http.io_slice_us " + flag);
    expect_thread_values({"--http-io-slice-us", flag, "--jobs-worker-slice-us", "0"}, thread_slices,
                         *base, io);
  }
}

// jobs.worker_slice_us: every jobs worker asks for that slice (3 ms by
// default), the I/O threads keep the system's; set after the worker's
// policy and nice (sched_setscheduler gives a thread the system's slice
// back), so it survives them. (SCHED_IDLE has no slice: Linux neither
// keeps nor shows one.)
TEST(CrewdJobsSlice, JobsWorkersAskForTheirSliceAndTheIoThreadsDoNot) {
  const std::optional<int> base = slice_of(::getpid(), 0);
  if (!base) GTEST_SKIP() << "this kernel shows no per-thread slice (se.slice, Linux 6.13+)";
  for (const auto& [flags, worker] : std::vector<std::pair<std::vector<std::string>, int>>{
           {{"--jobs-worker-slice-us", "2000"}, 2'000'000},
           {{}, 3'000'000},
           {{"--jobs-worker-slice-us", "0"}, *base},
           {{"--jobs-worker-slice-us", "5000", "--jobs-worker-policy", "batch",
             "--jobs-worker-nice", "3"},
            5'000'000}}) {
    SCOPED_TRACE(flags.empty() ? "default" : flags[1]);
    expect_thread_values(flags, thread_slices, worker, *base);
  }
}

// A compute worker is started by the I/O thread whose request grows the
// pool, and would inherit its slice: it sets the system's back.
TEST(CrewdIoSlice, AComputeWorkerStartedByAnIoThreadHasTheSystemsSlice) {
  const std::optional<int> base = slice_of(::getpid(), 0);
  if (!base) GTEST_SKIP() << "this kernel shows no per-thread slice (se.slice, Linux 6.13+)";
  Crewd crewd({"--listen", "127.0.0.1:0", "--http-io-slice-us", "100"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  ASSERT_EQ(get(port, "/api/v1/factorial/20").status, 200);
  // The worker that ran the task had run its start hook; another one may
  // still be starting: wait (bounded) for every one found to have set it.
  std::vector<std::pair<std::string, int>> compute;
  for (int i = 0; i < 1000 * kSlowdown; ++i) {
    compute.clear();
    for (const auto& t : thread_slices(crewd.pid()))
      if (t.first.rfind("compute-", 0) == 0) compute.push_back(t);
    if (!compute.empty() && std::all_of(compute.begin(), compute.end(),
                                        [&](const auto& t) { return t.second == *base; }))
      break;
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_FALSE(compute.empty()) << "no compute worker found";
  for (const auto& [name, slice] : compute) EXPECT_EQ(slice, *base) << name;
  expect_clean_stop(crewd);
}

// http.io_policy fifo: each I/O thread runs under SCHED_FIFO, with
// SCHED_RESET_ON_FORK; the jobs workers, started by crewd's main thread,
// keep SCHED_OTHER.
TEST(CrewdIoPolicy, FifoPutsTheIoThreadsAloneUnderSchedFifo) {
  if (!crew::test::may_use_fifo())
    GTEST_SKIP() << "SCHED_FIFO needs CAP_SYS_NICE or RLIMIT_RTPRIO >= 1";
  expect_thread_values({"--http-io-policy", "fifo"}, thread_policies, SCHED_OTHER,
                       SCHED_FIFO | SCHED_RESET_ON_FORK);
  expect_thread_values({"--http-io-policy", "normal"}, thread_policies, SCHED_OTHER, SCHED_OTHER);
}

// A compute worker started by a real-time I/O thread (the request that
// grows the pool) must not be real-time itself: a busy one would keep
// every normal thread off its CPU. compute.worker_policy normal sets
// nothing on the worker, so only the reset on fork keeps it normal.
TEST(CrewdIoPolicy, AComputeWorkerStartedByAFifoIoThreadIsNotRealTime) {
  if (!crew::test::may_use_fifo())
    GTEST_SKIP() << "SCHED_FIFO needs CAP_SYS_NICE or RLIMIT_RTPRIO >= 1";
  Crewd crewd(
      {"--listen", "127.0.0.1:0", "--http-io-policy", "fifo", "--compute-worker-policy", "normal"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  ASSERT_EQ(get(port, "/api/v1/factorial/20").status, 200);
  std::vector<std::pair<std::string, int>> compute;
  bool io_fifo = false;
  for (const auto& t : thread_policies(crewd.pid())) {
    if (t.first.rfind("compute-", 0) == 0) compute.push_back(t);
    if (is_io_thread(t.first)) io_fifo = (t.second & ~SCHED_RESET_ON_FORK) == SCHED_FIFO;
  }
  EXPECT_TRUE(io_fifo) << crewd.log();
  ASSERT_FALSE(compute.empty()) << "no compute worker found";
  for (const auto& [name, policy] : compute) EXPECT_EQ(policy, SCHED_OTHER) << name;
  expect_clean_stop(crewd);
}

}  // namespace
}  // namespace crewd::test

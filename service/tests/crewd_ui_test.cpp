// The operations console's server-side rules (service/ui/): who may use it
// (console_guard.hpp), the snapshot's caps and cost with 10,000 queued jobs
// (console.hpp, job_book.hpp), the series' histogram (pool_series.hpp), and
// the routes as a crewd process serves them. The page itself is tested in
// a browser (crewd_console_test.py).
//
// No HTML escaping is tested here because the server does none: the page
// puts every field into the DOM with textContent (the browser test checks
// that a hostile job name shows as text); the snapshot is JSON, whose
// encoder escapes what JSON needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <crew/pool.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "crewd_harness.hpp"
#include "crewd_suite.hpp"
#include "test_util.hpp"
#include "ui/console.hpp"
#include "ui/console_guard.hpp"
#include "ui/console_page.hpp"
#include "ui/job_book.hpp"
#include "ui/pool_series.hpp"

namespace crewd::test {
namespace {

using boost::asio::ip::make_address;
using Json = nlohmann::json;

Config::Ui enabled_ui() {
  Config::Ui ui;
  ui.enabled = true;
  return ui;
}

Request request_with(std::string authorization = {}, std::string site = {}) {
  Request r;
  r.authorization = std::move(authorization);
  r.sec_fetch_site = std::move(site);
  return r;
}

int refusal_status(const Config::Ui& ui, const char* local, const Request& r, ui::Access access) {
  const auto refused = ui::refusal(ui, make_address(local), r, access);
  return refused ? refused->status : 0;
}

TEST(ConsoleGuard, DisabledConsoleAnswers404ToEveryRoute) {
  const Config::Ui off;
  const Request r = request_with({}, "same-origin");
  for (auto access : {ui::Access::page, ui::Access::read, ui::Access::write}) {
    EXPECT_EQ(refusal_status(off, "127.0.0.1", r, access), 404);
  }
}

TEST(ConsoleGuard, ServesLoopbackOnlyUnlessAnAdminAddressIsSet) {
  Config::Ui ui = enabled_ui();
  EXPECT_TRUE(ui::served_on(ui, make_address("127.0.0.1")));
  EXPECT_TRUE(ui::served_on(ui, make_address("127.0.0.2")));
  EXPECT_TRUE(ui::served_on(ui, make_address("::1")));
  EXPECT_TRUE(ui::served_on(ui, make_address("::ffff:127.0.0.1")));
  EXPECT_FALSE(ui::served_on(ui, make_address("10.0.0.5")));
  EXPECT_FALSE(ui::served_on(ui, make_address("0.0.0.0")));
  EXPECT_FALSE(ui::served_on(ui, make_address("2001:db8::1")));
  EXPECT_EQ(refusal_status(ui, "10.0.0.5", request_with(), ui::Access::page), 403);

  ui.admin_address = "10.0.0.5";
  EXPECT_TRUE(ui::served_on(ui, make_address("10.0.0.5")));
  EXPECT_TRUE(ui::served_on(ui, make_address("::ffff:10.0.0.5")));
  EXPECT_FALSE(ui::served_on(ui, make_address("10.0.0.6")));
  EXPECT_EQ(refusal_status(ui, "10.0.0.5", request_with(), ui::Access::read), 0);
}

TEST(ConsoleGuard, TokenGuardsSnapshotAndActionsButNotThePage) {
  Config::Ui ui = enabled_ui();
  ui.token = "0123456789abcdef-token";
  EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with(), ui::Access::page), 0);
  const std::pair<const char*, int> cases[] = {
      {"", 401},
      {"Bearer wrong-token-0123456", 401},
      {"Bearer 0123456789abcdef-toke", 401},
      {"Basic 0123456789abcdef-token", 401},
      {"Bearer 0123456789abcdef-token", 0},
      {"bearer 0123456789abcdef-token", 0},  // the scheme is case-insensitive
  };
  for (const auto& [authorization, status] : cases) {
    EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with(authorization), ui::Access::read),
              status)
        << "Authorization: " << authorization;
  }
  // A good token does not make a cross-site action acceptable.
  EXPECT_EQ(
      refusal_status(ui, "127.0.0.1", request_with("Bearer 0123456789abcdef-token", "cross-site"),
                     ui::Access::write),
      403);
  EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with({}, "same-origin"), ui::Access::write),
            401);
  EXPECT_EQ(
      refusal_status(ui, "127.0.0.1", request_with("Bearer 0123456789abcdef-token", "same-origin"),
                     ui::Access::write),
      0);
}

TEST(ConsoleGuard, ActionsNeedSameOriginAndAreRefusedWhenReadOnly) {
  Config::Ui ui = enabled_ui();
  for (const char* site : {"", "cross-site", "same-site", "none", "SAME-ORIGIN"}) {
    EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with({}, site), ui::Access::write), 403)
        << "Sec-Fetch-Site: " << site;
  }
  EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with({}, "same-origin"), ui::Access::write), 0);
  // Reading needs no origin: the page's own fetches and curl alike.
  EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with({}, "cross-site"), ui::Access::read), 0);
  ui.read_only = true;
  EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with({}, "same-origin"), ui::Access::write),
            403);
  EXPECT_EQ(refusal_status(ui, "127.0.0.1", request_with(), ui::Access::read), 0);
}

TEST(ConsolePage, EveryNoncePlaceholderIsReplacedAndThePolicyNamesTheNonce) {
  const std::string nonce = ui::make_nonce();
  EXPECT_EQ(nonce.size(), 24u);
  EXPECT_NE(nonce, ui::make_nonce());
  const std::string page = ui::console_page(nonce);
  EXPECT_EQ(page.find("__NONCE__"), std::string::npos);
  EXPECT_NE(page.find("<script nonce=\"" + nonce + "\">"), std::string::npos);
  EXPECT_NE(page.find("<style nonce=\"" + nonce + "\">"), std::string::npos);
  EXPECT_LT(page.size(), 100u * 1024);
  // Nothing from elsewhere: no absolute URL in a src or href.
  EXPECT_EQ(page.find("src=\"http"), std::string::npos);
  EXPECT_EQ(page.find("href=\"http"), std::string::npos);
  for (const char* markup : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"}) {
    EXPECT_EQ(page.find(markup), std::string::npos) << markup;
  }
  const std::string headers = ui::page_headers(nonce);
  EXPECT_NE(headers.find("default-src 'none'"), std::string::npos);
  EXPECT_NE(headers.find("script-src 'nonce-" + nonce + "'"), std::string::npos);
  EXPECT_NE(headers.find("connect-src 'self'"), std::string::npos);
}

TEST(SnapshotQuery, DecodesTheFiltersAndIgnoresTheRest) {
  const ui::SnapshotQuery q =
      ui::parse_snapshot_query("/api/v1/ui/snapshot?x=1&outcome=timed_out&name=a%3Cb+c&bad");
  EXPECT_EQ(q.filter.outcome, "timed_out");
  EXPECT_EQ(q.filter.name, "a<b c");
  EXPECT_EQ(ui::parse_snapshot_query("/api/v1/ui/snapshot").filter.name, "");
  EXPECT_EQ(ui::parse_snapshot_query("/s?name=" + std::string(200, 'x')).filter.name.size(), 64u);
}

// The worker started in place of a written-off one may report before the
// write-off is announced (the announcement comes after the pool's locks):
// either order pairs them.
TEST(PoolSeries, AWriteOffGetsItsReplacementWhicheverIsHeardFirst) {
  ui::PoolSeries series;
  const crew::TaskEvent task{.pool = "jobs", .id = 7, .name = "stuck"};
  series.on_worker_abandoned("jobs", 1, task);
  series.on_worker_replaced("jobs", 2);
  series.on_worker_replaced("jobs", 4);  // before its write-off
  series.on_worker_abandoned("jobs", 3, task);
  const std::vector<ui::WriteOff> w = series.write_offs();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].worker, 1u);
  EXPECT_EQ(w[0].replacement, 2u);
  EXPECT_EQ(w[1].worker, 3u);
  EXPECT_EQ(w[1].replacement, 4u);
}

TEST(PoolSeries, QueueWaitBucketsAreHalfOctavesAndQuantilesTheirUpperBounds) {
  using std::chrono::microseconds;
  EXPECT_EQ(ui::PoolSeries::bucket_of(std::chrono::nanoseconds(500)), 0u);
  for (const std::int64_t us : {1, 2, 3, 5, 7, 100, 1000, 12345, 1'000'000}) {
    const std::size_t b = ui::PoolSeries::bucket_of(microseconds(us));
    EXPECT_LE(static_cast<std::uint64_t>(us), ui::PoolSeries::bucket_upper_us(b)) << us;
    EXPECT_GE(static_cast<std::uint64_t>(us) * 2, ui::PoolSeries::bucket_upper_us(b)) << us;
  }
  std::array<std::uint64_t, ui::PoolSeries::kBuckets> counts{};
  counts[ui::PoolSeries::bucket_of(microseconds(10))] = 98;
  counts[ui::PoolSeries::bucket_of(microseconds(5000))] = 2;
  EXPECT_EQ(ui::PoolSeries::quantile_us(counts, 0.5),
            ui::PoolSeries::bucket_upper_us(ui::PoolSeries::bucket_of(microseconds(10))));
  EXPECT_EQ(ui::PoolSeries::quantile_us(counts, 0.99),
            ui::PoolSeries::bucket_upper_us(ui::PoolSeries::bucket_of(microseconds(5000))));
}

TEST(PoolSeries, EachSampleHoldsTheOutcomesOfItsSecond) {
  ui::PoolSeries series;
  crew::PoolStats st;
  st.outcomes.succeeded = 5;
  series.sample(st);  // the first sample only primes
  EXPECT_TRUE(series.points().empty());
  st.outcomes.succeeded = 12;
  st.outcomes.cancelled = 1;
  st.busy = 3;
  series.on_task_started({}, std::chrono::microseconds(40));
  series.sample(st);
  const auto points = series.points();
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].outcomes.succeeded, 7u);
  EXPECT_EQ(points[0].outcomes.cancelled, 1u);
  EXPECT_EQ(points[0].busy, 3u);
  EXPECT_GE(points[0].wait_p50_us, 40u);
}

TEST(JobBook, HistoryIsBoundedNewestFirstAndFiltered) {
  ui::JobBook book(10);
  for (int i = 0; i < 25; ++i) {
    book.finish({.task_id = static_cast<std::uint64_t>(i + 1),
                 .name = i % 2 == 0 ? "even-" + std::to_string(i) : "odd-" + std::to_string(i),
                 .kind = JobKind::sleep,
                 .outcome = i % 5 == 0 ? "cancelled" : "succeeded",
                 .reason = {},
                 .queue_ms = 1,
                 .run_ms = 1,
                 .ended = ui::Clock::now(),
                 .request_id = {}});
  }
  const auto all = book.list(100, {});
  EXPECT_EQ(all.recent_total, 10u);
  ASSERT_EQ(all.recent.size(), 10u);
  EXPECT_EQ(all.recent.front().task_id, 25u);
  const auto few = book.list(3, {.outcome = "succeeded", .name = "odd"});
  EXPECT_EQ(few.recent.size(), 3u);
  // The last ten are 15..24; the odd ones 15..23, of which 15 was cancelled.
  EXPECT_EQ(few.recent_total, 4u);
  for (const auto& o : few.recent) {
    EXPECT_EQ(o.outcome, "succeeded");
    EXPECT_EQ(o.name.rfind("odd", 0), 0u);
  }
}

// The queued count survives a job that ran before the book heard of it
// (started() first), one cancelled while queued, and one refused at once.
TEST(JobBook, CountsQueuedJobsWhateverTheOrderOfEvents) {
  crew::Pool pool({.name = "jobs", .max_workers = 1});
  crew::Pool closed({.name = "closed", .max_workers = 1});
  (void)closed.shutdown(crew::ShutdownMode::drain, std::chrono::seconds(5));
  ui::JobBook book(10);
  const JobRequest job{.kind = JobKind::sleep, .ms = 1, .timeout_ms = 1000, .name = "j"};
  const auto outcome = [](crew::Task<void>& t, double queue_ms, std::string reason) {
    return ui::JobOutcome{.task_id = t.id(),
                          .name = "j",
                          .kind = JobKind::sleep,
                          .outcome = "x",
                          .reason = std::move(reason),
                          .queue_ms = queue_ms,
                          .run_ms = -1,
                          .ended = ui::Clock::now(),
                          .request_id = {}};
  };
  // Ran and ended before add(): its task's started() came first.
  crew::Task<void> early = pool.try_submit([](std::stop_token) {});
  ASSERT_TRUE(early.wait_for(std::chrono::seconds(5 * kSlowdown)));
  book.started();
  const ui::JobOutcome early_outcome = outcome(early, 0.1, "");
  book.add(job, std::make_shared<crew::Task<void>>(std::move(early)), ui::Clock::now());
  book.finish(early_outcome);
  EXPECT_EQ(book.list(10, {}).queued_total, 0u);

  pool.pause();
  crew::Task<void> first = pool.try_submit([](std::stop_token) {});
  crew::Task<void> queued = pool.try_submit([](std::stop_token) {});
  const std::uint64_t first_id = first.id(), queued_id = queued.id();
  book.add(job, std::make_shared<crew::Task<void>>(std::move(first)), ui::Clock::now());
  book.add(job, std::make_shared<crew::Task<void>>(std::move(queued)), ui::Clock::now());
  EXPECT_EQ(book.list(10, {}).queued_total, 2u);
  // Refused at once (a stopped pool): never counted.
  crew::Task<void> refused = closed.try_submit([](std::stop_token) {});
  ASSERT_EQ(refused.status(), crew::TaskStatus::rejected);
  book.add(job, std::make_shared<crew::Task<void>>(std::move(refused)), ui::Clock::now());
  EXPECT_EQ(book.list(10, {}).queued_total, 2u);
  EXPECT_EQ(book.cancel(queued_id), ui::CancelStatus::cancelled);
  crew::Task<void> gone;  // the outcome of the cancelled one: never started
  ui::JobOutcome o = outcome(gone, -1, "cancelled");
  o.task_id = queued_id;
  book.finish(o);
  EXPECT_EQ(book.list(10, {}).queued_total, 1u);
  EXPECT_EQ(book.list(10, {}).queued.at(0).task_id, first_id);
  // The first one runs (its started()) and ends.
  pool.resume();
  ASSERT_TRUE(pool.wait_idle(std::chrono::seconds(5 * kSlowdown)));
  book.started();
  ui::JobOutcome ran = outcome(gone, 0.1, "");
  ran.task_id = first_id;
  book.finish(ran);
  const auto left = book.list(10, {});
  EXPECT_EQ(left.queued_total, 0u);
  EXPECT_TRUE(left.queued.empty());
}

// 10,000 jobs queued behind one paused worker: the snapshot lists
// ui.snapshot_rows of them, fits ui.snapshot_bytes, says how many it left
// out, and takes well under 5 ms to build.
TEST(ConsoleSnapshot, TenThousandQueuedJobsStayWithinTheCaps) {
  Config config;
  config.ui.enabled = true;
  auto console = std::make_shared<ui::Console>(config);
  crew::Pool compute(
      {.name = "compute", .max_workers = 1, .observers = {console->compute_series()}});
  crew::Pool jobs({.name = "jobs",
                   .max_workers = 2,
                   .queue_capacity = 20'000,
                   .observers = {console->jobs_series()}});
  console->attach(compute, jobs);
  jobs.pause();
  constexpr int kJobs = 10'000;
  for (int i = 0; i < kJobs; ++i) {
    JobRequest job{
        .kind = JobKind::sleep, .ms = 1, .timeout_ms = 1000, .name = "queued-" + std::to_string(i)};
    console->jobs().add(job,
                        std::make_shared<crew::Task<void>>(
                            jobs.try_submit([](std::stop_token) {}, {.name = job.name})),
                        ui::Clock::now());
  }
  std::vector<double> build_ms;
  Json snap;
  std::size_t bytes = 0;
  for (int i = 0; i < 9; ++i) {
    const std::string body = console->snapshot({}, {});
    snap = Json::parse(body);
    bytes = body.size();
    build_ms.push_back(snap["cost"]["build_ms"].get<double>());
  }
  std::sort(build_ms.begin(), build_ms.end());
  EXPECT_LE(bytes, config.ui.snapshot_bytes);
  EXPECT_LT(bytes, 64u * 1024);
  EXPECT_EQ(snap["totals"]["queued"], kJobs);
  EXPECT_EQ(snap["queued"].size() + snap["omitted"]["queued"].get<std::size_t>(),
            static_cast<std::size_t>(kJobs));
  EXPECT_LE(snap["queued"].size(), config.ui.snapshot_rows);
  EXPECT_EQ(snap["queued"][0]["name"], "queued-0");
  EXPECT_LT(build_ms[build_ms.size() / 2], 5.0 * kSlowdown) << "median of 9";
  std::printf("snapshot with %d queued jobs: %zu bytes, median build %.3f ms of 9\n", kJobs, bytes,
              build_ms[build_ms.size() / 2]);

  // A tighter byte cap leaves more rows out, and says so.
  Config tight = config;
  tight.ui.snapshot_bytes = 16 * 1024;
  tight.ui.snapshot_rows = 1000;
  auto small = std::make_shared<ui::Console>(tight);
  small->attach(compute, jobs);
  for (int i = 0; i < 500; ++i) {
    JobRequest job{
        .kind = JobKind::sleep, .ms = 1, .timeout_ms = 1000, .name = "more-" + std::to_string(i)};
    small->jobs().add(job,
                      std::make_shared<crew::Task<void>>(
                          jobs.try_submit([](std::stop_token) {}, {.name = job.name})),
                      ui::Clock::now());
  }
  const std::string body = small->snapshot({}, {});
  const Json s = Json::parse(body);
  EXPECT_LE(body.size(), tight.ui.snapshot_bytes);
  EXPECT_EQ(s["queued"].size() + s["omitted"]["queued"].get<std::size_t>(), 500u);
  EXPECT_GT(s["omitted"]["queued"].get<std::size_t>(), 0u);
  small->stop();
  console->stop();
  (void)jobs.shutdown(crew::ShutdownMode::soft, std::chrono::seconds(5));
}

// ---- Through a crewd process ----

std::string header_lines(std::initializer_list<std::string> lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\r\n";
  return out;
}

Exchange console_request(int port, const std::string& method, const std::string& target,
                         std::initializer_list<std::string> headers = {}) {
  return send_request(port, request_text(method, target, {}, header_lines(headers)));
}

TEST(ConsoleRoutes, OffByDefault) {
  Crewd crewd({"--listen", "127.0.0.1:0"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  EXPECT_EQ(get(port, "/ui").status, 404);
  EXPECT_EQ(get(port, "/api/v1/ui/snapshot").status, 404);
  EXPECT_EQ(
      console_request(port, "POST", "/api/v1/ui/jobs/1/cancel", {"Sec-Fetch-Site: same-origin"})
          .status,
      404);
  expect_clean_stop(crewd);
}

TEST(ConsoleRoutes, PageSnapshotAndCancelFollowTheRules) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--ui-enabled", "true", "--ui-token",
               "console-token-0123456789"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  const Exchange page = get(port, "/ui");
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_EQ(page.header("content-type"), "text/html; charset=utf-8");
  const std::string csp = page.header("content-security-policy");
  const auto at = csp.find("'nonce-");
  ASSERT_NE(at, std::string::npos) << csp;
  const std::string nonce = csp.substr(at + 7, csp.find('\'', at + 7) - at - 7);
  EXPECT_NE(page.body.find("<script nonce=\"" + nonce + "\">"), std::string::npos);
  EXPECT_EQ(page.header("x-frame-options"), "DENY");

  EXPECT_EQ(get(port, "/api/v1/ui/snapshot").status, 401);
  const Exchange snap = console_request(port, "GET", "/api/v1/ui/snapshot",
                                        {"Authorization: Bearer console-token-0123456789"});
  ASSERT_EQ(snap.status, 200) << snap.body;
  const Json s = Json::parse(snap.body);
  EXPECT_EQ(s["pools"].size(), 2u);
  EXPECT_TRUE(s["shutdown"].is_null());

  // A job's request id shows in the history.
  ASSERT_EQ(send_request(port, request_text("POST", "/api/v1/jobs", R"({"kind":"sleep","ms":1})",
                                            "X-Request-Id: req-history-7\r\n"))
                .status,
            200);
  const Json after = Json::parse(console_request(port, "GET", "/api/v1/ui/snapshot",
                                                 {"Authorization: Bearer console-token-0123456789"})
                                     .body);
  ASSERT_FALSE(after["recent"].empty()) << after.dump();
  EXPECT_EQ(after["recent"][0]["request_id"], "req-history-7");

  const std::string auth = "Authorization: Bearer console-token-0123456789";
  EXPECT_EQ(console_request(port, "POST", "/api/v1/ui/jobs/1/cancel", {auth}).status, 403);
  EXPECT_EQ(console_request(port, "POST", "/api/v1/ui/jobs/1/cancel",
                            {auth, "Sec-Fetch-Site: cross-site"})
                .status,
            403);
  EXPECT_EQ(
      console_request(port, "POST", "/api/v1/ui/jobs/1/cancel", {"Sec-Fetch-Site: same-origin"})
          .status,
      401);
  // Allowed, but no such job.
  EXPECT_EQ(console_request(port, "POST", "/api/v1/ui/jobs/999/cancel",
                            {auth, "Sec-Fetch-Site: same-origin"})
                .status,
            404);
  EXPECT_EQ(console_request(port, "POST", "/api/v1/ui/jobs/x1/cancel",
                            {auth, "Sec-Fetch-Site: same-origin"})
                .status,
            400);
  expect_clean_stop(crewd);
}

TEST(ConsoleRoutes, ReadOnlyRefusesActions) {
  Crewd crewd({"--listen", "127.0.0.1:0", "--ui-enabled", "true", "--ui-read-only", "true"});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  const Exchange snap = get(port, "/api/v1/ui/snapshot");
  ASSERT_EQ(snap.status, 200);
  EXPECT_TRUE(Json::parse(snap.body)["read_only"].get<bool>());
  EXPECT_EQ(
      console_request(port, "POST", "/api/v1/ui/jobs/1/cancel", {"Sec-Fetch-Site: same-origin"})
          .status,
      403);
  expect_clean_stop(crewd);
}

}  // namespace
}  // namespace crewd::test

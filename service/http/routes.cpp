// crewd's routes (routes.hpp): the table, the path match and each route's
// handler: the factorial and job routes hand work to the compute and jobs
// pools; the others (/api/v1/pools, /metrics, /healthz, /readyz, and the
// console's /ui, snapshot and cancel) answer on the I/O thread.
//
// Threads: handlers run on the connection's I/O thread. The factorial and
// job tasks run on the pools' workers and touch only what they captured
// (their input, a JobRun, a reference that keeps the State alive); their
// completions are posted back to the connection's I/O thread by
// crew::asio, and can run until the task ends, or until serve() gives up
// on them at stop()'s deadline.
#include "http/routes.hpp"

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <crew/asio.hpp>
#include <crew/coro.hpp>
#include <crew/error.hpp>
#include <exception>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <variant>

#include "http/server_state.hpp"
#include "jobs/downstream.hpp"
#include "jobs/job_runner.hpp"
#include "jobs/job_spawn.hpp"
#include "jobs/jobs.hpp"
#include "ui/console.hpp"
#include "ui/console_guard.hpp"
#include "ui/console_page.hpp"

namespace crewd::http {
namespace {

using Json = nlohmann::ordered_json;

std::string dump(const Json& j) {
  // replace: a string holding invalid UTF-8 must not turn into an exception.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Response json_response(int status, const Json& body) {
  Response r;
  r.status = status;
  r.body = dump(body);
  return r;
}

// By hand: this is the route the throughput figures measure.
Response factorial_response(unsigned n, std::uint64_t value) {
  Response r;
  char buf[64] = "{\"n\":";
  char* p = buf + 5;
  p = std::to_chars(p, buf + sizeof(buf), n).ptr;
  constexpr std::string_view kResult = ",\"result\":";
  p = std::copy(kResult.begin(), kResult.end(), p);
  p = std::to_chars(p, buf + sizeof(buf), value).ptr;
  *p++ = '}';
  r.body.assign(buf, static_cast<std::size_t>(p - buf));
  return r;
}

// ---- Overload ----

// Retry-After of an overloaded pool's 503: its queue-wait estimate in whole
// seconds (at least 1), plus up to as much again at random, so that the
// refused clients do not all come back at once.
int overload_retry_after(std::chrono::nanoseconds wait_estimate) {
  const auto base =
      std::max<std::int64_t>(1, std::chrono::ceil<std::chrono::seconds>(wait_estimate).count());
  thread_local std::minstd_rand jitter(
      static_cast<std::uint32_t>(Clock::now().time_since_epoch().count()));
  const std::int64_t secs =
      base + static_cast<std::int64_t>(jitter() % static_cast<std::uint64_t>(base + 1));
  return static_cast<int>(std::min<std::int64_t>(secs, 3600));
}

// The 503 of a request `pool` refused or shed for `reason`.
Response overload_response(const crew::Pool& pool, crew::OverloadReason reason,
                           std::chrono::nanoseconds wait_estimate) {
  const std::string why(crew::to_string(reason));
  Response r = json_response(
      503, Json{{"error", "pool " + std::string(pool.name()) + " is overloaded (" + why + ")"},
                {"outcome", reason == crew::OverloadReason::codel ? "shed" : "rejected"},
                {"pool", pool.name()},
                {"reason", why},
                {"status", 503}});
  r.retry_after = overload_retry_after(wait_estimate);
  return r;
}

// A route's admit_head: refuses from the request's head while `pool`'s
// admission limit is reached.
std::optional<Response> refuse_if_overloaded(crew::Pool& pool) {
  const crew::OverloadHint h = pool.refuse_if_overloaded();
  if (h.reason == crew::OverloadReason::none) return std::nullopt;
  return overload_response(pool, h.reason, h.wait_estimate);
}
std::optional<Response> compute_admit_head(const State& s) {
  return refuse_if_overloaded(s.pools.compute);
}
// The 503 of a job past jobs.max_in_flight.
Response in_flight_response(const State& s) {
  Response r = json_response(
      503, Json{{"error", "jobs.max_in_flight (" + std::to_string(s.config.jobs.max_in_flight) +
                              ") jobs are in progress"},
                {"outcome", "rejected"},
                {"pool", "jobs"},
                {"reason", "max_in_flight"},
                {"status", 503}});
  r.retry_after = 1;
  return r;
}
std::optional<Response> jobs_admit_head(const State& s) {
  if (s.jobs_in_flight.load(std::memory_order_relaxed) >= s.config.jobs.max_in_flight) {
    return in_flight_response(s);
  }
  return refuse_if_overloaded(s.pools.jobs);
}

// A job's handle, shared by the handler, its completion (both on the
// connection's I/O thread; the handler sets it before the completion runs)
// and the console's book (which may cancel it from another I/O thread:
// neither changes the handle, so the completion's reads of its durations
// do not race that). `started` and `answer` are the task's, set on its
// worker; the completion reads `answer` once the task has ended.
struct JobRun {
  std::shared_ptr<crew::Task<void>> handle = std::make_shared<crew::Task<void>>();
  std::atomic<bool> started{false};
  std::string request_id;   // X-Request-Id, the task's correlation id
  DownstreamAnswer answer;  // a call job's
  // A coroutine job's first step and the end of its frame, crewd's clock
  // (the pool does not time coroutine tasks): its queue wait and run time.
  bool coroutine = false;
  std::atomic<Clock::rep> started_at{0};
  std::atomic<Clock::rep> ended_at{0};

  // Once the job has ended, in ms: the queue wait (to the outcome for one
  // that never started; none if refused at admission) and the run time.
  [[nodiscard]] std::pair<std::optional<double>, std::optional<double>> durations(
      Clock::time_point submitted) const {
    const crew::Task<void>& h = *handle;
    const bool did_start = started.load();
    if (!did_start && (!h.valid() || h.reason() == crew::Errc::rejected)) return {};
    if (!coroutine) {  // the pool's clock (Task::queue_wait, run_time)
      return {millis(h.queue_wait()),
              did_start ? std::optional<double>(millis(h.run_time())) : std::nullopt};
    }
    const auto at = [](const std::atomic<Clock::rep>& t) {
      const Clock::rep v = t.load();
      return v == 0 ? Clock::now() : Clock::time_point(Clock::duration(v));
    };
    if (!did_start) return {millis(Clock::now() - submitted), std::nullopt};
    return {millis(at(started_at) - submitted), millis(at(ended_at) - at(started_at))};
  }
};

// ---- Handlers that hand work to a pool ----

Response factorial_outcome(const State& s, unsigned n, std::exception_ptr e, std::uint64_t value) {
  if (!e) return factorial_response(n, value);
  std::string message = "pool compute did not run the task";
  try {
    std::rethrow_exception(e);
  } catch (const crew::Error& err) {
    if (err.overload_reason() != crew::OverloadReason::none) {
      return overload_response(s.pools.compute, err.overload_reason(),
                               s.pools.compute.overload_hint().wait_estimate);
    }
    if (err.code() == crew::Errc::rejected) {
      message =
          "pool compute refused the task (" + std::string(crew::to_string(err.admission())) + ")";
    } else {
      message += " (" + std::string(crew::to_string(err.code())) + ")";
    }
  } catch (const std::exception& err) {
    s.log->error("factorial {}: {}", n, err.what());
    return error_response(500, "internal error");
  }
  return error_response(503, message);
}

void factorial(Exchange& ex) {
  const auto parsed = parse_factorial_n(ex.arg());
  if (const auto* e = std::get_if<ParseError>(&parsed)) {
    ex.respond(error_response(400, e->message));
    return;
  }
  const unsigned n = std::get<unsigned>(parsed);
  State& s = ex.state();
  if (s.config.compute.inline_factorial) {
    ex.respond(factorial_response(n, crewd::factorial(n)));
    return;
  }
  crew::asio::async_try_submit(
      s.pools.compute, ex.executor(),
      [n, keep = s.shared_from_this()] { return crewd::factorial(n); },
      {.name = "factorial",
       .queue_timeout = s.config.compute.queue_timeout,
       .correlation_id = ex.request().request_id},
      [reply = ex.later(), n](std::exception_ptr e, std::uint64_t value) {
        reply(factorial_outcome(reply.state(), n, std::move(e), value));
      });
}

Response job_outcome(const State& s, const JobRequest& job, const JobRun& run,
                     Clock::time_point submitted, std::exception_ptr e) {
  const crew::Task<void>& handle = *run.handle;
  // Ended from the console (POST /api/v1/ui/jobs/{id}/cancel): queued, it
  // was dropped unrun (shutdown_dropped); running, its token was stopped.
  const bool console_cancel =
      s.console != nullptr && s.console->jobs().cancel_requested(handle.id());
  std::string outcome = "succeeded";
  int code = 200;
  std::string message;
  std::optional<crew::Errc> reason;
  crew::OverloadReason overload = crew::OverloadReason::none;
  bool retry_after = false;
  std::string downstream_reason;  // a call job's downstream gave no answer
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const crew::Error& err) {
      reason = err.code();
      overload = err.overload_reason();
      switch (err.code()) {
        case crew::Errc::timed_out:
        case crew::Errc::abandoned:
          outcome = "timed_out";
          code = 504;
          message = "the task ran past its deadline";
          break;
        case crew::Errc::cancelled:
          outcome = "cancelled";
          code = 503;
          message = console_cancel ? "the job was cancelled from the console"
                                   : "the task was cancelled (cancelled): crewd is shutting down";
          break;
        case crew::Errc::rejected:
          outcome = "rejected";
          code = 503;
          message =
              "pool jobs refused the task (" + std::string(crew::to_string(err.admission())) + ")";
          retry_after = true;
          break;
        case crew::Errc::overloaded:  // shed unrun (reason codel)
          outcome = "shed";
          code = 503;
          message = "pool jobs is overloaded (" + std::string(crew::to_string(overload)) + ")";
          retry_after = true;
          break;
        case crew::Errc::shutdown_dropped:
          if (console_cancel) {
            reason = crew::Errc::cancelled;
            outcome = "cancelled";
            code = 503;
            message = "the job was cancelled from the console before it started";
            break;
          }
          [[fallthrough]];
        default:  // shutdown_dropped, expired
          outcome = "rejected";
          code = 503;
          message =
              "pool jobs did not run the task (" + std::string(crew::to_string(err.code())) + ")";
          break;
      }
    } catch (const DownstreamError& err) {
      outcome = "failed";
      code = err.timed_out() ? 504 : 502;
      message = err.what();
      downstream_reason = err.timed_out() ? "downstream_timeout" : "downstream_error";
    } catch (const std::exception& err) {
      outcome = "failed";
      code = 500;
      message = "the task failed";
      s.log->error("job {}: {}", job.name, err.what());
    }
  }
  Json body{{"name", job.name}, {"kind", std::string(to_string(job.kind))}};
  if (job.kind != JobKind::call) body["ms"] = job.ms;
  body["timeout_ms"] = job.timeout_ms;
  body["task_id"] = handle.id();
  body["request_id"] = run.request_id;
  body["outcome"] = outcome;
  if (job.kind == JobKind::call && code == 200) body["downstream_status"] = run.answer.status;
  const auto [queue_ms, run_ms] = run.durations(submitted);
  if (queue_ms) body["queue_wait_ms"] = *queue_ms;
  if (run_ms) body["run_ms"] = *run_ms;
  body["total_ms"] = millis(Clock::now() - submitted);
  if (code != 200) {
    body["error"] = message;
    body["reason"] = reason                       ? std::string(crew::to_string(*reason))
                     : !downstream_reason.empty() ? downstream_reason
                                                  : "failed";
    body["status"] = code;
    if (overload != crew::OverloadReason::none) {
      body["pool"] = "jobs";
      body["reason"] = std::string(crew::to_string(overload));
    }
  }
  if (s.console != nullptr) {
    ui::JobOutcome o{.task_id = handle.id(),
                     .name = job.name,
                     .kind = job.kind,
                     .outcome = outcome,
                     .reason = code != 200 ? body["reason"].get<std::string>() : std::string(),
                     .queue_ms = -1,
                     .run_ms = -1,
                     .ended = Clock::now(),
                     .request_id = run.request_id};
    if (run_ms) {
      o.queue_ms = *queue_ms;
      o.run_ms = *run_ms;
    }
    s.console->jobs().finish(std::move(o));
  }
  Response r = json_response(code, body);
  if (retry_after) {
    r.retry_after = overload != crew::OverloadReason::none
                        ? overload_retry_after(s.pools.jobs.overload_hint().wait_estimate)
                        : 1;
  }
  return r;
}

// A sleep or call job: a coroutine task, suspended while it waits.
crew::Co<void> waiting_job(JobRequest job, std::shared_ptr<JobRun> run, ui::JobBook* book,
                           std::shared_ptr<State> keep, boost::asio::any_io_executor io) {
  run->started_at.store(Clock::now().time_since_epoch().count());
  run->started.store(true);
  if (book != nullptr) book->started();  // `keep` holds the console
  struct End {  // however the frame ends: returned, threw, or destroyed while it waited
    JobRun& run;
    ~End() { run.ended_at.store(Clock::now().time_since_epoch().count()); }
  } end{*run};
  if (job.kind == JobKind::call) {
    run->answer =
        co_await call_downstream(std::move(io), *keep->downstream, keep->config.jobs.call_timeout);
  } else {
    co_await crew::sleep_for(std::chrono::milliseconds(job.ms));
  }
}

// crew::asio delivers a job's completion from the task's run, just before
// the pool records the run's times and publishes its outcome (a few
// microseconds later, unless the worker is preempted meanwhile). The answer
// carries those times, so it waits for them by going round the I/O thread's
// loop, never blocking it; past kSettleBound (a worker descheduled that
// long) it answers with what the handle shows.
constexpr auto kSettleBound = std::chrono::milliseconds(200);

void answer_when_settled(Reply reply, boost::asio::io_context::executor_type io,
                         const JobRequest& job, std::shared_ptr<JobRun> run,
                         Clock::time_point submitted, std::exception_ptr e,
                         Clock::time_point give_up) {
  const crew::Task<void>& handle = *run->handle;
  if (!handle.valid() || handle.ready() || Clock::now() >= give_up) {
    reply(job_outcome(reply.state(), job, *run, submitted, std::move(e)));
    return;
  }
  boost::asio::post(io, [reply = std::move(reply), io, job, run = std::move(run), submitted,
                         e = std::move(e), give_up]() mutable {
    answer_when_settled(std::move(reply), io, job, std::move(run), submitted, std::move(e),
                        give_up);
  });
}

void job(Exchange& ex) {
  State& s = ex.state();
  const auto parsed = parse_job_request(ex.request().body, s.config.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&parsed)) {
    ex.respond(error_response(400, e->message));
    return;
  }
  // A slot of jobs.max_in_flight, given back when the job is answered.
  if (s.jobs_in_flight.fetch_add(1, std::memory_order_relaxed) >= s.config.jobs.max_in_flight) {
    s.jobs_in_flight.fetch_sub(1, std::memory_order_relaxed);
    ex.respond(in_flight_response(s));
    return;
  }
  const JobRequest job = std::get<JobRequest>(parsed);
  auto run = std::make_shared<JobRun>();
  run->request_id = ex.request().request_id;
  const auto submitted = Clock::now();
  ui::JobBook* book = s.console != nullptr ? &s.console->jobs() : nullptr;
  crew::TaskOptions options{.name = job.name,
                            .timeout = std::chrono::milliseconds(job.timeout_ms),
                            .queue_timeout = s.config.jobs.queue_timeout,
                            .correlation_id = run->request_id};
  auto done = [reply = ex.later(), job, run, submitted,
               io = ex.executor()](std::exception_ptr e) mutable {
    reply.state().jobs_in_flight.fetch_sub(1, std::memory_order_relaxed);
    answer_when_settled(std::move(reply), io, job, std::move(run), submitted, std::move(e),
                        Clock::now() + kSettleBound);
  };
  // The completion runs on this thread, after this handler: the handle is
  // set and the console's book has the job by then.
  if (job.kind == JobKind::sleep || job.kind == JobKind::call) {
    run->coroutine = true;
    async_try_spawn(s.pools.jobs, ex.executor(),
                    waiting_job(job, run, book, s.shared_from_this(), ex.executor()),
                    std::move(options), std::move(done), run->handle);
  } else {
    auto task = [job, run, book, keep = s.shared_from_this()](const crew::TaskContext& ctx) {
      run->started.store(true);
      if (book != nullptr) book->started();  // `keep` holds the console
      (void)run_job_until(job, Clock::now() + std::chrono::milliseconds(job.ms), ctx.stop_token);
    };
    crew::asio::async_try_submit(s.pools.jobs, ex.executor(), std::move(task), std::move(options),
                                 std::move(done), *run->handle);
  }
  if (s.console != nullptr) {
    s.console->jobs().add(job, run->handle, submitted,
                          std::shared_ptr<const std::atomic<bool>>(run, &run->started));
  }
}

// A job whose body is not sent yet (Expect: 100-continue): the pool would
// refuse it, so say so before the client sends the body (a slot may free
// meanwhile; then the client retries).
std::optional<Response> job_expect_body(const State& s) {
  if (s.jobs_in_flight.load(std::memory_order_relaxed) >= s.config.jobs.max_in_flight) {
    return in_flight_response(s);
  }
  if (s.pools.jobs.stats().queued < s.config.jobs.queue) return std::nullopt;
  Response r = error_response(503, "pool jobs refused the task (full)");
  r.retry_after = 1;
  return r;
}

// ---- Handlers that answer on the I/O thread ----

void pools(Exchange& ex) {
  const State& s = ex.state();
  Json list = Json::array();
  for (const crew::Pool* p : {&s.pools.compute, &s.pools.jobs}) {
    const crew::PoolStats st = p->stats();
    const crew::CoroutineTasks coroutines = crew::coroutine_tasks(*p);
    Json worker_list = Json::array();
    for (const crew::WorkerInfo& w : p->workers()) {
      Json worker{{"id", w.id},
                  {"state", std::string(crew::to_string(w.state))},
                  {"running_ms", millis(w.running_for)}};
      if (w.task.id != 0 || !w.task.name.empty()) {
        worker["task"] =
            Json{{"id", w.task.id}, {"name", w.task.name}, {"request_id", w.task.correlation_id}};
      }
      if (w.stop_reason != crew::WorkerStopReason::none) {
        worker["stop_reason"] = std::string(crew::to_string(w.stop_reason));
      }
      worker_list.push_back(std::move(worker));
    }
    Json pool = ui::pool_json(*p, st, coroutines);
    pool["helped"] = st.helped;
    pool["worker_list"] = std::move(worker_list);
    // Coroutine tasks suspended now (sleep and call jobs waiting): on no worker.
    Json suspended_list = Json::array();
    for (const crew::SuspendedCoroutine& c : coroutines.suspended) {
      suspended_list.push_back(Json{
          {"task",
           Json{{"id", c.task.id}, {"name", c.task.name}, {"request_id", c.task.correlation_id}}},
          {"waits_on", std::string(c.waits_on)},
          {"suspended_ms", millis(c.suspended_for)}});
    }
    pool["suspended_list"] = std::move(suspended_list);
    list.push_back(std::move(pool));
  }
  const Json http{{"io_threads", s.workers.size()},
                  {"connections", s.open.load(std::memory_order_relaxed)},
                  {"max_connections", s.max_connections},
                  {"lingering", s.lingering.load(std::memory_order_relaxed)},
                  {"max_lingering", s.max_lingering}};
  ex.respond(json_response(
      200, Json{{"halting", s.gate.halting()}, {"http", http}, {"pools", std::move(list)}}));
}

void metrics(Exchange& ex) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : ex.state().exposed) {
    auto f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  Response r;
  r.body = prometheus::TextSerializer().Serialize(families);
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  ex.respond(std::move(r));
}

void healthz(Exchange& ex) { ex.respond(json_response(200, Json{{"status", "ok"}})); }

void readyz(Exchange& ex) {
  const State& s = ex.state();
  const std::string why = s.not_ready_reason();
  if (why.empty()) {
    ex.respond(json_response(200, Json{{"status", "ready"}}));
  } else if (s.gate.halting()) {
    ex.respond(json_response(503, Json{{"status", "halting"}}));
  } else {
    ex.respond(json_response(503, Json{{"status", "not ready"}, {"reason", why}}));
  }
}

// ---- The operations console (service/ui/console.hpp) ----

std::optional<Response> console_refusal(Exchange& ex, ui::Access access) {
  const State& s = ex.state();
  if (s.console == nullptr) return error_response(404, "no such route");
  return ui::refusal(s.console->settings(), ex.local_address(), ex.request(), access);
}

void console_page(Exchange& ex) {
  if (auto refused = console_refusal(ex, ui::Access::page)) {
    ex.respond(std::move(*refused));
    return;
  }
  const std::string nonce = ui::make_nonce();
  Response r;
  r.body = ui::console_page(nonce);
  r.content_type = "text/html; charset=utf-8";
  r.headers = ui::page_headers(nonce);
  ex.respond(std::move(r));
}

void console_snapshot(Exchange& ex) {
  if (auto refused = console_refusal(ex, ui::Access::read)) {
    ex.respond(std::move(*refused));
    return;
  }
  const State& s = ex.state();
  Response r;
  r.body = s.console->snapshot(ui::parse_snapshot_query(ex.request().target),
                               {.halting = s.gate.halting(),
                                .connections = s.open.load(std::memory_order_relaxed),
                                .admitted_in_flight = s.gate.admitted_open()});
  r.headers = ui::api_headers();
  ex.respond(std::move(r));
}

void console_cancel(Exchange& ex) {
  if (auto refused = console_refusal(ex, ui::Access::write)) {
    ex.respond(std::move(*refused));
    return;
  }
  std::uint64_t id = 0;
  const std::string_view arg = ex.arg();
  const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), id);
  if (ec != std::errc{} || end != arg.data() + arg.size() || id == 0) {
    ex.respond(error_response(400, "the job's task id must be a positive integer"));
    return;
  }
  const ui::CancelStatus done = ex.state().console->jobs().cancel(id);
  if (done == ui::CancelStatus::not_found) {
    ex.respond(error_response(404, "no queued or running job with that task id"));
    return;
  }
  Response r =
      json_response(200, Json{{"task_id", id}, {"result", std::string(ui::to_string(done))}});
  r.headers = ui::api_headers();
  ex.respond(std::move(r));
}

// ---- The table ----

// The order is that of the `route` labels in /metrics.
constexpr Route kRoutes[] = {
    {.path = "/api/v1/factorial/{n}",
     .methods = "GET, HEAD",
     .handler = factorial,
     .work = true,
     .admit_head = compute_admit_head},
    {.path = "/api/v1/jobs",
     .methods = "POST",
     .handler = job,
     .work = true,
     .expect_body = job_expect_body,
     .admit_head = jobs_admit_head},
    {.path = "/api/v1/pools", .methods = "GET, HEAD", .handler = pools},
    {.path = "/metrics", .methods = "GET, HEAD", .handler = metrics},
    {.path = "/healthz", .methods = "GET, HEAD", .handler = healthz},
    {.path = "/readyz", .methods = "GET, HEAD", .handler = readyz},
    {.path = "/ui", .methods = "GET, HEAD", .handler = console_page},
    {.path = "/api/v1/ui/snapshot", .methods = "GET, HEAD", .handler = console_snapshot},
    {.path = "/api/v1/ui/jobs/{id}/cancel", .methods = "POST", .handler = console_cancel},
};

}  // namespace

std::span<const Route> routes() noexcept { return kRoutes; }

std::vector<std::string> route_labels() {
  std::vector<std::string> labels;
  for (const Route& r : kRoutes) labels.emplace_back(r.path);
  return labels;
}

std::size_t route_index(const Route* route) noexcept {
  return route == nullptr ? std::size(kRoutes) : static_cast<std::size_t>(route - kRoutes);
}

RouteMatch match_route(std::string_view method, std::string_view path) {
  for (const Route& r : kRoutes) {
    if (const auto arg = match_path(r.path, path)) {
      return {.route = &r, .method_allowed = method_listed(r.methods, method), .arg = *arg};
    }
  }
  return {};
}

}  // namespace crewd::http

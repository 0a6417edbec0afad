// crewd's job routes (job_routes.hpp).
//
// Threads: handlers and completions run on the connection's I/O thread.
// A job's task runs on a jobs pool worker and touches only what it captured
// (its input, a JobRun, a reference that keeps the State alive); its
// completion is posted back to the connection's I/O thread (crew::asio for
// thread tasks, job_spawn for coroutine tasks), and can run until the task
// ends, or until serve() gives up on it at stop()'s deadline.
#include "http/job_routes.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <crew/asio.hpp>
#include <crew/coro.hpp>
#include <crew/error.hpp>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "http/responses.hpp"
#include "http/server_state.hpp"
#include "jobs/downstream.hpp"
#include "jobs/job_runner.hpp"
#include "jobs/job_spawn.hpp"
#include "jobs/jobs.hpp"
#include "ui/console.hpp"

namespace crewd::http {
namespace {

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

// The 400 of a bad X-Priority or X-Deadline-Ms: the message names the
// header, and so does "header".
Response header_error(const ParseError& e) {
  const std::string_view message = e.message;
  return json_response(400, Json{{"error", e.message},
                                 {"header", std::string(message.substr(0, message.find(' ')))},
                                 {"status", 400}});
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
  // A coroutine job's first step and the end of its frame, crewd's clock:
  // its queue wait and run time. Its answer leaves from the frame's end,
  // before the pool records the task's end on the handle, and is not held
  // back for it (answer_when_settled) as a thread job's would be (whose
  // completion comes after the pool has recorded it).
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
  std::string reason;  // the body's `reason` (reason_of)
  crew::OverloadReason overload = crew::OverloadReason::none;
  bool retry_after = false;
  std::string downstream_reason;  // a call job's downstream gave no answer
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const crew::Error& err) {
      reason = reason_of(err);
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
            reason = "cancelled";
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
    body["reason"] = !reason.empty()              ? reason
                     : !downstream_reason.empty() ? downstream_reason
                                                  : "failed";
    body["status"] = code;
    if (overload != crew::OverloadReason::none) body["pool"] = "jobs";
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

// crew::asio delivers a thread job's completion once the pool has
// published its outcome and recorded the run's times, which the answer
// carries: the handle is ready when the completion runs. A job that ended
// unrun is settled when the pool decides it (refused, shed) or when its
// start comes up (expired in the queue, answered at once from here); if
// the handle is not ready yet anyway, the answer waits for it without
// blocking the I/O thread, on a timer (OutcomeBackoff: 20 us, doubling, at
// most 1 ms); past kSettleBound it answers with what the handle shows.
constexpr auto kSettleBound = std::chrono::seconds(2);

void answer_when_settled(Reply reply, boost::asio::io_context::executor_type io,
                         const JobRequest& job, std::shared_ptr<JobRun> run,
                         Clock::time_point submitted, std::exception_ptr e,
                         Clock::time_point give_up, OutcomeBackoff backoff = {}) {
  const crew::Task<void>& handle = *run->handle;
  // A coroutine job is timed by crewd itself (job_outcome), and one that
  // expired in the queue is settled only when its start comes up: no wait.
  if (run->coroutine || !handle.valid() || handle.ready() || Clock::now() >= give_up) {
    reply(job_outcome(reply.state(), job, *run, submitted, std::move(e)));
    return;
  }
  auto timer = std::make_shared<boost::asio::steady_timer>(io, backoff.next());
  auto again = [reply = std::move(reply), io, job, run = std::move(run), submitted,
                e = std::move(e), give_up, backoff]() mutable {
    answer_when_settled(std::move(reply), io, job, std::move(run), submitted, std::move(e), give_up,
                        backoff);
  };
  timer->async_wait([timer, again = std::move(again)](const boost::system::error_code&) mutable {
    again();  // also when cancelled (the I/O loop stopping): answers at once or gives up
  });
}

}  // namespace

std::optional<Response> jobs_admit_head(const State& s, const Request& req) {
  const auto headers = parse_job_headers(req.priority, req.deadline_ms, s.config.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&headers)) return header_error(*e);
  if (s.jobs_in_flight.load(std::memory_order_relaxed) >= s.config.jobs.max_in_flight) {
    return in_flight_response(s);
  }
  if (auto refused = refuse_if_overloaded(s.pools.jobs)) return refused;
  // A deadline the queue cannot meet: refused now rather than at it.
  const auto deadline = std::get<JobHeaders>(headers).deadline_ms;
  const auto wait = s.pools.jobs.overload_hint().wait_estimate;
  if (deadline && wait > std::chrono::milliseconds(*deadline)) {
    return overload_response(s.pools.jobs, crew::OverloadReason::deadline, wait);
  }
  return std::nullopt;
}

void job(Exchange& ex) {
  State& s = ex.state();
  const Request& req = ex.request();
  const auto parsed = parse_job_request(req.body, s.config.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&parsed)) {
    ex.respond(error_response(400, e->message));
    return;
  }
  const auto head = parse_job_headers(req.priority, req.deadline_ms, s.config.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&head)) {  // answered from the head already
    ex.respond(header_error(*e));
    return;
  }
  const JobHeaders& headers = std::get<JobHeaders>(head);
  // The queue deadline: jobs.queue_timeout_ms, or the request's own
  // X-Deadline-Ms from its head's arrival if that comes first.
  auto queue_timeout =
      std::chrono::duration_cast<std::chrono::nanoseconds>(s.config.jobs.queue_timeout);
  if (headers.deadline_ms) {
    const auto left = req.head_at + std::chrono::milliseconds(*headers.deadline_ms) - Clock::now();
    if (left <= Clock::duration::zero()) {  // spent reading the body
      ex.respond(overload_response(s.pools.jobs, crew::OverloadReason::deadline,
                                   s.pools.jobs.overload_hint().wait_estimate));
      return;
    }
    queue_timeout =
        std::min(queue_timeout, std::chrono::duration_cast<std::chrono::nanoseconds>(left));
  }
  // A slot of jobs.max_in_flight, given back when the job is answered.
  if (s.jobs_in_flight.fetch_add(1, std::memory_order_relaxed) >= s.config.jobs.max_in_flight) {
    s.jobs_in_flight.fetch_sub(1, std::memory_order_relaxed);
    ex.respond(in_flight_response(s));
    return;
  }
  const JobRequest job = std::get<JobRequest>(parsed);
  auto run = std::make_shared<JobRun>();
  run->request_id = req.request_id;
  const auto submitted = Clock::now();
  ui::JobBook* book = s.console != nullptr ? &s.console->jobs() : nullptr;
  crew::TaskOptions options{.name = job.name,
                            .timeout = std::chrono::milliseconds(job.timeout_ms),
                            .queue_timeout = queue_timeout,
                            .priority = static_cast<std::uint8_t>(headers.priority),
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

}  // namespace crewd::http

// What each route of crewd answers (the routes are matched in request.cpp):
// the dispatch of a complete request, the factorial and job routes that
// hand work to the compute and jobs pools, and the routes answered on the
// I/O thread (/api/v1/pools, /metrics, /healthz, /readyz).
//
// Threads: all of it runs on the connection's I/O thread. The factorial and
// job tasks run on the pools' workers and touch only what they captured
// (their input, a JobTimes, a reference that keeps the State alive); their
// completions (on_factorial, on_job) are posted back to the connection's
// I/O thread by crew::asio, and can run until the task ends, or until
// serve() gives up on them at stop()'s deadline.
#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <crew/asio.hpp>
#include <crew/error.hpp>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>

#include "http/connection.hpp"
#include "http/server_state.hpp"
#include "jobs/job_runner.hpp"
#include "jobs/jobs.hpp"

namespace crewd {
namespace http {
namespace {

using Json = nlohmann::ordered_json;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

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

}  // namespace

// A job's clock and id, shared between the task (which may end without a
// value: timed out, cancelled) and the handler.
struct JobTimes {
  std::atomic<std::int64_t> started_ns{0};
  std::atomic<std::int64_t> ended_ns{0};
  std::atomic<std::uint64_t> id{0};
};

// ---- Connection: requests ----

Connection::Step Connection::on_request() {
  phase_ = Phase::handling;
  deadline_ = Clock::time_point::max();
  const Request& req = parser_->request();
  head_only_ = req.method == "HEAD";
  if (refused_) return respond(error_response(503, "crewd is shutting down"));
  if (match_.route == Route::unmatched) return respond(error_response(404, "no such route"));
  if (!match_.method_allowed) {
    Response r = error_response(405, std::string("method not allowed; allowed: ") + match_.allow);
    r.allow = match_.allow;
    return respond(std::move(r));
  }
  switch (match_.route) {
    case Route::factorial:
      return factorial(match_.arg);
    case Route::jobs:
      return job();
    case Route::pools:
      return respond(s_.pools_json());
    case Route::metrics:
      return respond(s_.metrics_text());
    case Route::healthz:
      return respond(json_response(200, Json{{"status", "ok"}}));
    case Route::readyz:
      return respond(s_.readiness());
    case Route::unmatched:
      break;
  }
  return respond(error_response(404, "no such route"));
}

// ---- Connection: routes that do work ----

Connection::Step Connection::factorial(std::string_view arg) {
  const auto parsed = parse_factorial_n(arg);
  if (const auto* e = std::get_if<ParseError>(&parsed))
    return respond(error_response(400, e->message));
  const unsigned n = std::get<unsigned>(parsed);
  if (s_.config.compute.inline_factorial)
    return respond(factorial_response(n, crewd::factorial(n)));
  crew::asio::async_try_submit(
      s_.pools.compute, w_.ioc.get_executor(),
      [n, keep = s_.shared_from_this()] { return crewd::factorial(n); },
      {.name = "factorial", .queue_timeout = s_.config.compute.queue_timeout},
      [self = shared_from_this(), n](std::exception_ptr e, std::uint64_t value) {
        self->on_factorial(n, std::move(e), value);
      });
  s_.gate.end_handover(handing_over_);  // the pool has it (or refused it)
  return Step::waiting;
}

void Connection::resume(Response r) {
  if (respond(std::move(r)) == Step::more) advance();
}

void Connection::on_factorial(unsigned n, std::exception_ptr e, std::uint64_t value) {
  if (e) {
    std::string message = "pool compute did not run the task";
    try {
      std::rethrow_exception(e);
    } catch (const crew::Error& err) {
      if (err.code() == crew::Errc::rejected) {
        message =
            "pool compute refused the task (" + std::string(crew::to_string(err.admission())) + ")";
      } else {
        message += " (" + std::string(crew::to_string(err.code())) + ")";
      }
    } catch (const std::exception& err) {
      s_.log->error("factorial {}: {}", n, err.what());
      resume(error_response(500, "internal error"));
      return;
    }
    resume(error_response(503, message));
    return;
  }
  resume(factorial_response(n, value));
}

Connection::Step Connection::job() {
  const auto parsed = parse_job_request(parser_->request().body, s_.config.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&parsed))
    return respond(error_response(400, e->message));
  const JobRequest job = std::get<JobRequest>(parsed);
  auto times = std::make_shared<JobTimes>();
  const auto submitted = Clock::now();
  crew::asio::async_try_submit(
      s_.pools.jobs, w_.ioc.get_executor(),
      [job, times, keep = s_.shared_from_this()](const crew::TaskContext& ctx) {
        times->id.store(ctx.id);
        times->started_ns.store(now_ns());
        (void)run_job_until(job, Clock::now() + std::chrono::milliseconds(job.ms), ctx.stop_token);
        times->ended_ns.store(now_ns());
      },
      {.name = job.name,
       .timeout = std::chrono::milliseconds(job.timeout_ms),
       .queue_timeout = s_.config.jobs.queue_timeout},
      [self = shared_from_this(), job, times, submitted](std::exception_ptr e) {
        self->on_job(job, times, submitted, std::move(e));
      });
  s_.gate.end_handover(handing_over_);  // the pool has it (or refused it)
  return Step::waiting;
}

void Connection::on_job(const JobRequest& job, const std::shared_ptr<JobTimes>& times,
                        Clock::time_point submitted, std::exception_ptr e) {
  std::string outcome = "succeeded";
  int code = 200;
  std::string message;
  std::optional<crew::Errc> reason;
  bool retry_after = false;
  if (e) {
    try {
      std::rethrow_exception(e);
    } catch (const crew::Error& err) {
      reason = err.code();
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
          message = "the task was cancelled (cancelled): crewd is shutting down";
          break;
        case crew::Errc::rejected:
          outcome = "rejected";
          code = 503;
          message =
              "pool jobs refused the task (" + std::string(crew::to_string(err.admission())) + ")";
          retry_after = true;
          break;
        default:  // shutdown_dropped, expired
          outcome = "rejected";
          code = 503;
          message =
              "pool jobs did not run the task (" + std::string(crew::to_string(err.code())) + ")";
          break;
      }
    } catch (const std::exception& err) {
      outcome = "failed";
      code = 500;
      message = "the task failed";
      s_.log->error("job {}: {}", job.name, err.what());
    }
  }
  Json body{{"name", job.name},
            {"kind", std::string(to_string(job.kind))},
            {"ms", job.ms},
            {"timeout_ms", job.timeout_ms},
            {"task_id", times->id.load()},
            {"outcome", outcome}};
  const std::int64_t started = times->started_ns.load();
  const std::int64_t ended = times->ended_ns.load();
  const std::int64_t submitted_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(submitted.time_since_epoch()).count();
  if (started != 0) {
    body["queue_ms"] = static_cast<double>(started - submitted_ns) / 1e6;
    if (ended != 0) body["run_ms"] = static_cast<double>(ended - started) / 1e6;
  }
  body["total_ms"] = millis(Clock::now() - submitted);
  if (code != 200) {
    body["error"] = message;
    body["reason"] = reason ? std::string(crew::to_string(*reason)) : "failed";
    body["status"] = code;
  }
  Response r = json_response(code, body);
  r.retry_after = retry_after;
  resume(std::move(r));
}

}  // namespace http

// ---- State: the routes answered on the I/O thread ----

using http::Json;
using http::json_response;
using http::millis;
using State = HttpServer::State;

Response State::pools_json() const {
  Json list = Json::array();
  for (const crew::Pool* p : {&pools.compute, &pools.jobs}) {
    const crew::PoolStats s = p->stats();
    Json worker_list = Json::array();
    for (const crew::WorkerInfo& w : p->workers()) {
      Json worker{{"id", w.id},
                  {"state", std::string(crew::to_string(w.state))},
                  {"running_ms", millis(w.running_for)}};
      if (w.task.id != 0 || !w.task.name.empty()) {
        worker["task"] = Json{{"id", w.task.id}, {"name", w.task.name}};
      }
      worker_list.push_back(std::move(worker));
    }
    list.push_back(Json{{"name", std::string(p->name())},
                        {"state", std::string(crew::to_string(s.state))},
                        {"workers", s.workers},
                        {"idle", s.idle},
                        {"busy", s.busy},
                        {"max_workers", s.max_workers},
                        {"queued", s.queued},
                        {"blocked_submitters", s.blocked_submitters},
                        {"submitted", s.submitted},
                        {"outcomes",
                         {{"succeeded", s.outcomes.succeeded},
                          {"failed", s.outcomes.failed},
                          {"cancelled", s.outcomes.cancelled},
                          {"timed_out", s.outcomes.timed_out},
                          {"rejected", s.outcomes.rejected}}},
                        {"abandoned", s.abandoned},
                        {"workers_replaced", s.workers_replaced},
                        {"helped", s.helped},
                        {"worker_list", std::move(worker_list)}});
  }
  const Json http{{"io_threads", workers.size()},
                  {"connections", open.load(std::memory_order_relaxed)},
                  {"max_connections", max_connections},
                  {"lingering", lingering.load(std::memory_order_relaxed)},
                  {"max_lingering", max_lingering}};
  return json_response(
      200, Json{{"halting", gate.halting()}, {"http", http}, {"pools", std::move(list)}});
}

Response State::metrics_text() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : exposed) {
    auto f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  Response r;
  r.body = prometheus::TextSerializer().Serialize(families);
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  return r;
}

Response State::readiness() const {
  if (gate.halting()) return json_response(503, Json{{"status", "halting"}});
  for (const auto& check : readiness_checks) {
    if (std::string why = check(); !why.empty()) {
      return json_response(503, Json{{"status", "not ready"}, {"reason", why}});
    }
  }
  return json_response(200, Json{{"status", "ready"}});
}

}  // namespace crewd

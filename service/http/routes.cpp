// crewd's routes (routes.hpp): the table, the path match and each route's
// handler: the factorial and job routes hand work to the compute and jobs
// pools; the others (/api/v1/pools, /metrics, /healthz, /readyz) answer on
// the I/O thread.
//
// Threads: handlers run on the connection's I/O thread. The factorial and
// job tasks run on the pools' workers and touch only what they captured
// (their input, a JobTimes, a reference that keeps the State alive); their
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
#include <crew/error.hpp>
#include <exception>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>

#include "http/server_state.hpp"
#include "jobs/job_runner.hpp"
#include "jobs/jobs.hpp"

namespace crewd::http {
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

// A job's clock and id, shared between the task (which may end without a
// value: timed out, cancelled) and the handler.
struct JobTimes {
  std::atomic<std::int64_t> started_ns{0};
  std::atomic<std::int64_t> ended_ns{0};
  std::atomic<std::uint64_t> id{0};
};

// ---- Handlers that hand work to a pool ----

Response factorial_outcome(const State& s, unsigned n, std::exception_ptr e, std::uint64_t value) {
  if (!e) return factorial_response(n, value);
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
      {.name = "factorial", .queue_timeout = s.config.compute.queue_timeout},
      [reply = ex.later(), n](std::exception_ptr e, std::uint64_t value) {
        reply(factorial_outcome(reply.state(), n, std::move(e), value));
      });
}

Response job_outcome(const State& s, const JobRequest& job, const JobTimes& times,
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
      s.log->error("job {}: {}", job.name, err.what());
    }
  }
  Json body{{"name", job.name},
            {"kind", std::string(to_string(job.kind))},
            {"ms", job.ms},
            {"timeout_ms", job.timeout_ms},
            {"task_id", times.id.load()},
            {"outcome", outcome}};
  const std::int64_t started = times.started_ns.load();
  const std::int64_t ended = times.ended_ns.load();
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
  return r;
}

void job(Exchange& ex) {
  State& s = ex.state();
  const auto parsed = parse_job_request(ex.request().body, s.config.jobs.limits);
  if (const auto* e = std::get_if<ParseError>(&parsed)) {
    ex.respond(error_response(400, e->message));
    return;
  }
  const JobRequest job = std::get<JobRequest>(parsed);
  auto times = std::make_shared<JobTimes>();
  const auto submitted = Clock::now();
  crew::asio::async_try_submit(
      s.pools.jobs, ex.executor(),
      [job, times, keep = s.shared_from_this()](const crew::TaskContext& ctx) {
        times->id.store(ctx.id);
        times->started_ns.store(now_ns());
        (void)run_job_until(job, Clock::now() + std::chrono::milliseconds(job.ms), ctx.stop_token);
        times->ended_ns.store(now_ns());
      },
      {.name = job.name,
       .timeout = std::chrono::milliseconds(job.timeout_ms),
       .queue_timeout = s.config.jobs.queue_timeout},
      [reply = ex.later(), job, times, submitted](std::exception_ptr e) {
        reply(job_outcome(reply.state(), job, *times, submitted, std::move(e)));
      });
}

// A job whose body is not sent yet (Expect: 100-continue): the pool would
// refuse it, so say so before the client sends the body (a slot may free
// meanwhile; then the client retries).
std::optional<Response> job_expect_body(const State& s) {
  if (s.pools.jobs.stats().queued < s.config.jobs.queue) return std::nullopt;
  Response r = error_response(503, "pool jobs refused the task (full)");
  r.retry_after = true;
  return r;
}

// ---- Handlers that answer on the I/O thread ----

void pools(Exchange& ex) {
  const State& s = ex.state();
  Json list = Json::array();
  for (const crew::Pool* p : {&s.pools.compute, &s.pools.jobs}) {
    const crew::PoolStats st = p->stats();
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
                        {"state", std::string(crew::to_string(st.state))},
                        {"workers", st.workers},
                        {"idle", st.idle},
                        {"busy", st.busy},
                        {"max_workers", st.max_workers},
                        {"queued", st.queued},
                        {"blocked_submitters", st.blocked_submitters},
                        {"submitted", st.submitted},
                        {"outcomes",
                         {{"succeeded", st.outcomes.succeeded},
                          {"failed", st.outcomes.failed},
                          {"cancelled", st.outcomes.cancelled},
                          {"timed_out", st.outcomes.timed_out},
                          {"rejected", st.outcomes.rejected}}},
                        {"abandoned", st.abandoned},
                        {"workers_replaced", st.workers_replaced},
                        {"helped", st.helped},
                        {"worker_list", std::move(worker_list)}});
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

// ---- The table ----

// The order is that of the `route` labels in /metrics.
constexpr Route kRoutes[] = {
    {.path = "/api/v1/factorial/{n}", .methods = "GET, HEAD", .handler = factorial, .work = true},
    {.path = "/api/v1/jobs",
     .methods = "POST",
     .handler = job,
     .work = true,
     .expect_body = job_expect_body},
    {.path = "/api/v1/pools", .methods = "GET, HEAD", .handler = pools},
    {.path = "/metrics", .methods = "GET, HEAD", .handler = metrics},
    {.path = "/healthz", .methods = "GET, HEAD", .handler = healthz},
    {.path = "/readyz", .methods = "GET, HEAD", .handler = readyz},
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

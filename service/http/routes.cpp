// crewd's routes (routes.hpp): the table, the path match and each route's
// handler: the factorial route hands work to the compute pool, the job
// routes (job_routes.cpp) to the jobs pool; the others (/api/v1/pools,
// /metrics, /healthz, /readyz, and the console's /ui, snapshot and cancel)
// answer on the I/O thread.
//
// Threads: handlers run on the connection's I/O thread. The factorial tasks
// run on the compute pool's workers and touch only their input and a
// reference that keeps the State alive; their completions are posted back
// to the connection's I/O thread by crew::asio, and can run until the task
// ends, or until serve() gives up on them at stop()'s deadline.
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

#include "http/job_routes.hpp"
#include "http/responses.hpp"
#include "http/server_state.hpp"
#include "jobs/job_runner.hpp"
#include "jobs/jobs.hpp"
#include "ui/console.hpp"
#include "ui/console_guard.hpp"
#include "ui/console_page.hpp"

namespace crewd::http {
namespace {

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

std::optional<Response> compute_admit_head(const State& s, const Request&) {
  return refuse_if_overloaded(s.pools.compute);
}

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

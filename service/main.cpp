// crewd: an HTTP service on crew pools; what `make run` starts.
//
//   crewd [--config FILE] [--listen HOST:PORT] [--<setting> VALUE ...]
//   crewd --help | --print-config
//
// Three pools: "http" serves client connections (one worker per connection,
// plugged into cpp-httplib), "compute" runs factorials (short tasks),
// "jobs" runs jobs (long tasks with a deadline). crew::Application owns the
// lifecycle: the listening socket is its resource (a port in use fails
// start-up, exit 3), SIGTERM halts it, and the main function below stops
// serving in the order docs/crewd.md ("Lifecycle") describes.
#include <chrono>
#include <condition_variable>
#include <crew/application.hpp>
#include <crew/pool.hpp>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "config.hpp"
#include "http.hpp"
#include "http_metrics.hpp"
#include "logging.hpp"
#include "process_metrics.hpp"

#if CREWD_CREW_METRICS
#include <crew/metrics.hpp>
#endif
#if CREWD_REDIS
#include "redis_jobs.hpp"
#endif

namespace crewd {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The listening socket, bound during the application's init so that a port
// in use fails start-up (exit 3) before anything is served.
class ListenSocket final : public crew::Resource {
 public:
  ListenSocket(HttpServer& server, const Config& config, spdlog::logger& log)
      : server_(server), config_(config), log_(log) {}
  void init(const crew::ResourceCall&) override {
    const int port = server_.bind();
    log_.info("listening on http://{}:{}", config_.host, port);
  }
  void close(const crew::ResourceCall&) override {}  // main's stop sequence closed it

 private:
  HttpServer& server_;
  const Config& config_;
  spdlog::logger& log_;
};

std::int64_t monotonic_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

double millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Sleeps until `deadline` or until `stop` is requested.
void sleep_until(Clock::time_point deadline, const std::stop_token& stop) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  cv.wait_until(lock, stop, deadline, [] { return false; });
}

int run(const Config& config) {
  auto log = make_logger(config.log_level);
  auto crew_log = std::make_shared<CrewLog>(log, config.log_level);

  auto request_metrics = std::make_shared<RequestMetrics>();
  std::vector<std::shared_ptr<prometheus::Collectable>> exposed;
  std::vector<std::shared_ptr<crew::Observer>> http_observers, compute_observers, jobs_observers;
#if CREWD_CREW_METRICS
  auto pool_metrics = std::make_shared<crew::PrometheusMetrics>();
  exposed.push_back(pool_metrics);
  http_observers.push_back(pool_metrics->observer("http"));
  compute_observers.push_back(pool_metrics->observer("compute"));
  jobs_observers.push_back(pool_metrics->observer("jobs"));
#endif
  exposed.push_back(request_metrics);
  exposed.push_back(std::make_shared<ProcessMetrics>());

  // Connections: blocking when full, so that a burst waits in the kernel's
  // backlog instead of being dropped. Always drained: a connection in the
  // pool is a client waiting for an answer.
  crew::Pool http({.name = "http",
                   .max_workers = config.http.workers,
                   .queue_capacity = config.http.queue,
                   .overflow = crew::Overflow::block,
                   .shutdown_mode = crew::ShutdownMode::drain,
                   .shutdown_timeout = config.shutdown.timeout,
                   .observers = http_observers,
                   .logger = crew_log});
  // Work pools refuse when full (the client gets 503 at once) and stop in
  // the configured mode.
  crew::Pool compute({.name = "compute",
                      .max_workers = config.compute.workers != 0
                                         ? config.compute.workers
                                         : std::max(1u, std::thread::hardware_concurrency()),
                      .queue_capacity = config.compute.queue,
                      .overflow = crew::Overflow::reject,
                      .shutdown_mode = config.shutdown.mode,
                      .shutdown_timeout = config.shutdown.timeout,
                      .observers = compute_observers,
                      .logger = crew_log});
  crew::Pool jobs({.name = "jobs",
                   .max_workers = config.jobs.workers,
                   .queue_capacity = config.jobs.queue,
                   .overflow = crew::Overflow::reject,
                   .task_timeout = std::chrono::milliseconds(config.jobs.limits.default_timeout_ms),
                   .shutdown_mode = config.shutdown.mode,
                   .shutdown_timeout = config.shutdown.timeout,
                   .observers = jobs_observers,
                   .logger = crew_log});
#if CREWD_CREW_METRICS
  for (const crew::Pool* p : {&http, &compute, &jobs}) pool_metrics->watch(*p);
#endif
#if CREWD_REDIS
  // Jobs from a Redis stream, on the jobs pool ([redis]; off without an address).
  std::shared_ptr<RedisJobs> redis;
  if (!config.redis.address.empty()) {
    redis = std::make_shared<RedisJobs>(config, jobs, log);
    exposed.push_back(redis);
  }
#endif

  HttpServer server(config, {http, compute, jobs}, log, *request_metrics, std::move(exposed));
#if CREWD_REDIS
  if (redis) {
    server.add_readiness_check(
        [&redis]() -> std::string { return redis->connected() ? "" : "redis disconnected"; });
  }
#endif

  crew::Application app({.name = "crewd",
                         .termination_timeout = config.shutdown.termination_timeout,
                         .shutdown_timeout = 5s,
                         .logger = crew_log});
  app.add_resource(std::make_shared<ListenSocket>(server, config, *log), {.name = "listener"});
  app.add_pool(compute);
  app.add_pool(jobs);
  // Not the http pool: the accept loop drains it once the listener is
  // closed. Shut down hard from outside, it would drop connections whose
  // sockets the listener still serves.

  return app.run([&](const crew::Context& ctx) {
    std::jthread accept_loop([&server] { server.serve(); });
    log->info(
        "ready: pools http (max {} workers), compute (max {}), jobs (max {}); shutdown mode {}",
        http.stats().max_workers, compute.stats().max_workers, jobs.stats().max_workers,
        crew::to_string(config.shutdown.mode));
#if CREWD_REDIS
    if (redis) redis->start();
#endif

    sleep_until(Clock::time_point::max(), ctx.halt_token());
    const auto halted = Clock::now();
    const auto deadline = halted + config.shutdown.termination_timeout;
    server.halt();
#if CREWD_REDIS
    // No new stream entries from now on; what is in flight is the jobs
    // pool's to finish or drop below, and what does not finish stays
    // pending for another instance.
    if (redis) {
      redis->stop();
      log->info("stopped reading the Redis stream; {} stream jobs in flight",
                redis->stats().in_flight);
    }
#endif
    log->info(
        "halting (monotonic_ns={}): /readyz answers 503; requests arriving within {} ms "
        "are still served",
        monotonic_ns(halted), config.shutdown.admit_grace.count());

    // Requests sent before the signal may still sit in the kernel's queues.
    sleep_until(halted + config.shutdown.admit_grace, ctx.stop_token());
    server.close_admission();
    log->info(
        "admission closed (monotonic_ns={}): new work gets 503; {} connections still owe "
        "their first request, {} requests in flight",
        monotonic_ns(Clock::now()), server.first_requests_pending(), server.admitted_in_flight());
    if (!server.wait_first_requests(deadline, ctx.stop_token())) {
      log->warn("{} connections accepted before the cut sent no request in time",
                server.first_requests_pending());
    }

    // Everything admitted has been handed to the pools: stop them in the
    // configured mode while the clients still wait, so that each one hears
    // its task's outcome (drain: all run; soft: queued ones get 503; hard:
    // running jobs are cancelled too). Each pool logs its report.
    {
      std::jthread jobs_stop([&jobs] { (void)jobs.shutdown(); });
      (void)compute.shutdown();
    }

    if (!server.wait_admitted(deadline, ctx.stop_token())) {
      log->warn("{} admitted requests still unanswered", server.admitted_in_flight());
    }
    server.stop();
    accept_loop.join();
    log->info("stopped serving {:.1f} ms after the halt", millis(Clock::now() - halted));
  });
}

}  // namespace
}  // namespace crewd

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const crewd::LoadResult loaded = crewd::load_config(args, crewd::process_environment());
  if (!loaded.out.empty()) std::fputs(loaded.out.c_str(), stdout);
  if (!loaded.err.empty()) std::fputs(loaded.err.c_str(), stderr);
  if (!loaded.run) return loaded.exit_code;
  return crewd::run(loaded.config);
}

// crewd: an HTTP service on crew pools; what `make run` starts.
//
//   crewd [--config FILE] [--listen HOST:PORT] [--<setting> VALUE ...]
//   crewd --help | --print-config
//
// A few I/O threads serve every client connection (service/http/server.hpp, on
// Boost.Asio); two pools do the work: "compute" runs factorials (short
// tasks), "jobs" runs jobs (long tasks with a deadline). crew::Application
// owns the lifecycle: the listening socket is its resource (a port in use
// fails start-up, exit 3), SIGTERM halts it, and the main function below
// stops serving in the order docs/crewd.md ("Lifecycle") describes.
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <crew/application.hpp>
#include <crew/pool.hpp>
#include <crew/usable_cpus.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "http/routes.hpp"
#include "http/scheduling.hpp"
#include "http/server.hpp"
#include "jobs/jobs.hpp"
#include "logging.hpp"
#include "metrics/http_metrics.hpp"
#include "metrics/process_metrics.hpp"
#include "metrics/readiness_metrics.hpp"
#include "ui/console.hpp"

#if CREWD_CREW_METRICS
#include <crew/metrics.hpp>
#endif
#if CREWD_REDIS
#include "jobs/redis_jobs.hpp"
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
    const bool v6 = config_.host.find(':') != std::string::npos;
    log_.info("listening on http://{}:{}", v6 ? "[" + config_.host + "]" : config_.host, port);
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

// What a pool ran in its whole life and during its stop: the pool's own
// report line counts only the outcomes decided while the shutdown ran.
void log_pool_report(spdlog::logger& log, const crew::Pool& pool, const crew::ShutdownReport& r) {
  const crew::OutcomeCounts& l = r.lifetime;
  const crew::OutcomeCounts& d = r.during;
  log.info(
      "pool {} stopped ({}{}, {:.1f} ms): in its life succeeded {}, failed {}, cancelled {}, "
      "timed out {}, rejected {}; during the stop succeeded {}, cancelled {}, timed out {}, "
      "rejected {}",
      pool.name(), crew::to_string(r.mode), r.escalated ? ", escalated to hard" : "",
      millis(r.elapsed), l.succeeded, l.failed, l.cancelled, l.timed_out, l.rejected, d.succeeded,
      d.cancelled, d.timed_out, d.rejected);
}

// For a pool of `workers`; `max_limit`: the limit's ceiling, 0 for crew's
// default (queue capacity x priority levels + workers).
crew::OverloadOptions overload_options(const Config::Overload& o, std::size_t workers,
                                       std::size_t max_limit = 0) {
  using Signal = Config::Overload::RunTimeSignal;
  const bool run_time = o.adaptive_limit &&
                        (o.run_time_signal == Signal::on ||
                         (o.run_time_signal == Signal::automatic && workers > crew::usable_cpus()));
  return {.enabled = o.enabled,
          .target = o.target,
          .interval = o.interval,
          .adaptive_limit = o.adaptive_limit,
          .max_limit = max_limit,
          .run_time_signal = run_time};
}

// The on_worker_start hook of crewd's pools, run by each worker on its own
// thread as it starts. For pool jobs (`jobs`) it applies
// jobs.worker_policy idle (batch is crew's own PoolOptions::worker_policy;
// crew has no idle policy) and jobs.worker_nice: the worker's nice set to
// `steps` above crewd's (read by main's thread before the pool starts: a
// worker started later by another thread inherits that thread's nice, so
// the value is set, not added), at most 19. Last, the time slice (a policy
// change resets it): jobs.worker_slice_us for a jobs worker, else the
// system's, since a worker started by an I/O thread (a submission that
// grows the pool) inherits that thread's http.io_slice_us, and a worker as
// short-sliced as the I/O threads would preempt them as readily as they
// preempt it. Lowering one's own priority needs no privilege; each refusal
// is logged once and the worker runs as is.
std::function<void(std::uint64_t)> worker_start_hook(const Config& config, bool jobs,
                                                     const std::shared_ptr<spdlog::logger>& log) {
  // The slice this pool's workers take: jobs.worker_slice_us for pool
  // jobs, else the system's; set on each worker only if an I/O thread
  // (which may start it) has another one, or the pool asks for its own.
  const std::chrono::microseconds own =
      jobs ? config.jobs.worker_slice : std::chrono::microseconds(0);
  const bool slice = config.http.io_slice.count() != 0 || own.count() != 0;
  const unsigned steps = jobs ? config.jobs.worker_nice : 0;
  const bool idle = jobs && config.jobs.worker_policy == Config::Jobs::WorkerPolicy::idle;
  if (!slice && steps == 0 && !idle) return {};
  errno = 0;
  const int base = ::getpriority(PRIO_PROCESS, 0);  // the calling thread's on Linux
  const int nice = std::min(19, (errno != 0 ? 0 : base) + static_cast<int>(steps));
  struct Warned {
    std::atomic<bool> slice{false}, policy{false}, nice{false};
  };
  auto warned = std::make_shared<Warned>();
  // The policy first: sched_setscheduler gives the thread the system's
  // slice again.
  return [slice, own, steps, nice, idle, log, warned](std::uint64_t) {
    const sched_param none{};
    if (idle && ::sched_setscheduler(0, SCHED_IDLE, &none) != 0 && !warned->policy.exchange(true)) {
      log->warn("jobs.worker_policy: cannot set SCHED_IDLE on a jobs worker: {}",
                std::strerror(errno));
    }
    if (steps != 0 && ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice) != 0 &&
        !warned->nice.exchange(true)) {
      log->warn("jobs.worker_nice: cannot set a jobs worker's nice to {}: {}", nice,
                std::strerror(errno));
    }
    if (slice) {
      if (const std::string error = set_time_slice(own);
          !error.empty() && !warned->slice.exchange(true)) {
        log->warn("cannot give a pool worker its time slice ({} us): {}", own.count(), error);
      }
    }
  };
}

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
  // The figure the defaults below (I/O threads, compute workers) and crew's
  // own defaults are sized from, and the limit it came from.
  const crew::UsableCpus& cpus = crew::usable_cpus_details();
  log->info("usable CPUs: {} (from {}: {} in the affinity mask, {})", cpus.count,
            crew::to_string(cpus.limit), cpus.affinity,
            cpus.cgroup.empty()
                ? std::string("no cgroup CPU quota")
                : fmt::format("cgroup CPU quota {:.2f} at {}", cpus.quota, cpus.cgroup));

  auto request_metrics = std::make_shared<RequestMetrics>(http::route_labels());
  std::vector<std::shared_ptr<prometheus::Collectable>> exposed;
  std::vector<std::shared_ptr<crew::Observer>> compute_observers, jobs_observers;
#if CREWD_CREW_METRICS
  auto pool_metrics = std::make_shared<crew::PrometheusMetrics>();
  exposed.push_back(pool_metrics);
  compute_observers.push_back(pool_metrics->observer("compute"));
  jobs_observers.push_back(pool_metrics->observer("jobs"));
#endif
  exposed.push_back(request_metrics);
  exposed.push_back(std::make_shared<ProcessMetrics>());
  auto readiness = std::make_shared<ReadinessMetrics>();
  exposed.push_back(readiness);
  // The operations console ([ui]; off by default): its series observe the pools.
  std::shared_ptr<ui::Console> console;
  if (config.ui.enabled) {
    console = std::make_shared<ui::Console>(config);
    exposed.push_back(console->metrics());
    compute_observers.push_back(console->compute_series());
    jobs_observers.push_back(console->jobs_series());
  }

  // Work pools refuse when full (the client gets 503 at once) and stop in
  // the configured mode.
  const std::size_t compute_workers =
      config.compute.workers != 0 ? config.compute.workers : crew::usable_cpus();
  crew::Pool compute({.name = "compute",
                      .max_workers = compute_workers,
                      .queue_capacity = config.compute.queue,
                      .overflow = crew::Overflow::reject,
                      .shutdown_mode = config.shutdown.mode,
                      .shutdown_timeout = config.shutdown.timeout,
                      .on_worker_start = worker_start_hook(config, /*jobs=*/false, log),
                      .observers = compute_observers,
                      .logger = crew_log,
                      .spin = config.compute.spin,
                      .spin_when_contended = config.compute.spin_when_contended,
                      .worker_policy = config.compute.worker_policy,
                      .overload = overload_options(config.compute.overload, compute_workers)});
  // jobs.workers threads, all started with the pool: sleep and call jobs
  // wait without one, so the count is for the jobs that compute or block.
  crew::Pool jobs({.name = "jobs",
                   .min_workers = config.jobs.workers,
                   .max_workers = config.jobs.workers,
                   .queue_capacity = config.jobs.queue,    // per priority level
                   .priority_levels = kJobPriorityLevels,  // X-Priority: low, normal, high
                   .overflow = crew::Overflow::reject,
                   .task_timeout = std::chrono::milliseconds(config.jobs.limits.default_timeout_ms),
                   .shutdown_mode = config.shutdown.mode,
                   .shutdown_timeout = config.shutdown.timeout,
                   .on_worker_start = worker_start_hook(config, /*jobs=*/true, log),
                   .observers = jobs_observers,
                   .logger = crew_log,
                   .worker_policy = config.jobs.worker_policy == Config::Jobs::WorkerPolicy::batch
                                        ? crew::WorkerPolicy::batch
                                        : crew::WorkerPolicy::normal,
                   // One level's queue plus the workers: the priorities order
                   // the admitted jobs, they do not admit three times as many.
                   .overload = overload_options(config.jobs.overload, config.jobs.workers,
                                                config.jobs.queue + config.jobs.workers),
                   .time_tasks = true});  // a job's answer has its queue wait and run time
  // The console's sampler reads the pools: it stops before they are destroyed.
  struct StopConsole {
    ui::Console* console;
    ~StopConsole() {
      if (console != nullptr) console->stop();
    }
  } stop_console{console.get()};
#if CREWD_CREW_METRICS
  for (const crew::Pool* p : {&compute, &jobs}) pool_metrics->watch(*p);
#endif
#if CREWD_REDIS
  // Jobs from a Redis stream, on the jobs pool ([redis]; off without an address).
  std::shared_ptr<RedisJobs> redis;
  if (!config.redis.address.empty()) {
    redis = std::make_shared<RedisJobs>(config, jobs, log);
    exposed.push_back(redis);
  }
#endif

  HttpServer server(config, {compute, jobs}, log, request_metrics, std::move(exposed));
  if (console) {
    console->attach(compute, jobs);
    server.set_console(console);
    log->info("operations console at /ui (on loopback{}{}{})",
              config.ui.admin_address.empty() ? "" : " and " + config.ui.admin_address,
              config.ui.token.empty() ? "" : ", with a bearer token",
              config.ui.read_only ? ", read-only" : "");
  }
#if CREWD_REDIS
  if (redis && console) {
    console->set_redis([r = redis.get()] { return r->view(); });
  }
  if (redis) {
    server.add_readiness_check(
        [&redis]() -> std::string { return redis->connected() ? "" : "redis disconnected"; });
  }
#endif
  // Scrapes run on the I/O threads, within serve(): the server outlives them.
  readiness->set_probe([&server] { return server.not_ready_reason(); });

  crew::Application app({.name = "crewd",
                         .termination_timeout = config.shutdown.termination_timeout,
                         .shutdown_timeout = 5s,
                         .logger = crew_log});
  app.add_resource(std::make_shared<ListenSocket>(server, config, *log), {.name = "listener"});
  app.add_pool(compute);
  app.add_pool(jobs);

  // Set when the main function below has returned. If the Application gave
  // up on it (termination timeout, a second signal), it may still be
  // running, with the I/O threads and the pools in use: then the process
  // ends without destroying anything they refer to.
  std::atomic<bool> main_started{false};
  std::atomic<bool> main_returned{false};
  const int code = app.run([&](const crew::Context& ctx) {
    main_started.store(true);
    struct Returned {
      std::atomic<bool>& flag;
      ~Returned() { flag.store(true); }
    } returned{main_returned};
    std::jthread io([&server] { server.serve(); });
    log->info(
        "ready: {} I/O threads (at most {} connections), pools compute (max {} workers), jobs "
        "(max {}); shutdown mode {}",
        server.io_threads(), server.max_connections(), compute.stats().max_workers,
        jobs.stats().max_workers, crew::to_string(config.shutdown.mode));
#if CREWD_REDIS
    if (redis) redis->start();
#endif

    sleep_until(Clock::time_point::max(), ctx.halt_token());
    const auto halted = Clock::now();
    const auto deadline = halted + config.shutdown.termination_timeout;
    server.halt();
    if (console) console->stop_phase(ui::StopPhase::halting);
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
    // What still arrives must leave the pools their shutdown.timeout and a
    // margin before the termination deadline (at least 100 ms from now).
    const auto pools_margin = std::min<Clock::duration>(
        1s, std::chrono::duration_cast<Clock::duration>(config.shutdown.termination_timeout) / 10);
    const auto receive_by =
        std::max(Clock::now() + 100ms, deadline - config.shutdown.timeout - pools_margin);
    server.close_admission(receive_by);
    if (console) console->stop_phase(ui::StopPhase::admission_closed);
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
      if (console) {
        console->pools_stopping(Clock::now() + config.shutdown.timeout, deadline);
      }
      crew::ShutdownReport jobs_report;
      std::jthread jobs_stop([&jobs, &jobs_report] { jobs_report = jobs.shutdown(); });
      const crew::ShutdownReport compute_report = compute.shutdown();
      jobs_stop.join();
      log_pool_report(*log, compute, compute_report);
      log_pool_report(*log, jobs, jobs_report);
      if (console) {
        console->pool_report(compute.name(), compute_report);
        console->pool_report(jobs.name(), jobs_report);
      }
    }

    if (!server.wait_admitted(deadline, ctx.stop_token())) {
      log->warn("{} admitted requests still unanswered", server.admitted_in_flight());
    }
    // An open console shows the reports before the listener closes (its
    // page polls every 500 ms), within the termination budget.
    if (console) {
      console->wait_report_seen(std::min<Clock::duration>(
          1500ms, std::max<Clock::duration>(deadline - Clock::now(), Clock::duration::zero()) / 4));
    }
    // Connections still reading a request keep their deadlines; whatever is
    // left just before the termination timeout is closed.
    const auto margin = std::min<Clock::duration>(
        500ms,
        std::chrono::duration_cast<Clock::duration>(config.shutdown.termination_timeout) / 10);
    server.stop(deadline - margin);
    io.join();
    log->info("stopped serving {:.1f} ms after the halt", millis(Clock::now() - halted));
  });
  if (main_started.load() && !main_returned.load()) {
    log->flush();
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
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

// service/jobs/redis_jobs.hpp: crewd's jobs from a Redis stream (settings
// [redis]; docs/distributed.md). Built when crew::redis is (hiredis found).
//
// With redis.address set, crewd is one consumer of the stream's consumer
// group: a crew::StreamSource takes entries on the "jobs" pool, never more
// than redis.in_flight at a time, runs each as the job POST /api/v1/jobs
// would run (the entry's fields are that request's: kind, ms, timeout_ms,
// name, validated by the same rules), writes its outcome to the results
// stream and acknowledges it. Failures are retried, then dead-lettered;
// entries a dead instance left pending are claimed after redis.claim_idle_ms.
//
// RedisJobs is also the Prometheus collector of all this:
//   crewd_redis_connected              1 while both connections are up
//   crewd_redis_reconnects_total       reconnections after a lost connection
//   crewd_redis_entries_total{how}     entries taken: "read" (new), "claimed"
//   crewd_redis_jobs_total{outcome}    "succeeded", "dead_lettered",
//                                      "left_pending" (stopped unfinished)
//   crewd_redis_job_retries_total      failed attempts retried here
//   crewd_redis_job_refusals_total     jobs the pool refused or shed, held
//                                      and submitted again after a backoff
//   crewd_redis_jobs_in_flight         taken and not yet settled
//   crewd_redis_stream_lag{stream,group}      entries not yet delivered to
//   crewd_redis_stream_pending{stream,group}  the group; delivered, not
//                                      acknowledged (the whole group's)
//   crewd_redis_dead_letters{stream}   entries in the dead-letter stream (all
//                                      instances')
// The stream gauges come from XINFO GROUPS and XLEN, polled once a second on
// a connection of their own; they are left out of a scrape while unknown.
//
// Thread safety: start() and stop() are called from one thread (main's);
// the queries and Collect() from any. Destroying a RedisJobs stops it; jobs
// still in flight keep running on the pool and settle themselves
// (crew::StreamSource shares its state with them). The jobs pool must
// outlive it.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <atomic>
#include <crew/pool.hpp>
#include <crew/stream_source.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "ui/console.hpp"

namespace spdlog {
class logger;
}  // namespace spdlog

namespace crewd {

// The fields of a stream entry as a job request, by the rules of the body of
// POST /api/v1/jobs: "ms" and "timeout_ms" are decimal text here, and any
// other field (or a bad value) is refused with the same message.
[[nodiscard]] std::variant<JobRequest, ParseError> parse_job_fields(
    const std::vector<std::pair<std::string, std::string>>& fields, const JobLimits& limits);

// The crew::StreamSource settings [redis] and [jobs] make.
[[nodiscard]] crew::StreamSourceOptions stream_source_options(const Config& config);

class RedisJobs final : public prometheus::Collectable {
 public:
  // Does not connect: start() does. Throws crew::Error for options the
  // source refuses (load_config has already checked them).
  RedisJobs(const Config& config, crew::Pool& jobs, std::shared_ptr<spdlog::logger> log);
  ~RedisJobs() override;
  RedisJobs(const RedisJobs&) = delete;
  RedisJobs& operator=(const RedisJobs&) = delete;

  // Starts consuming (and retrying the connection until Redis answers).
  void start();
  // Stops taking entries now, within the source's read block (100 ms);
  // what is in flight is left to the jobs pool's shutdown. Idempotent.
  void stop() noexcept;

  [[nodiscard]] bool connected() const noexcept;
  [[nodiscard]] crew::StreamSourceStats stats() const;
  // What the operations console shows: the stats, the stream gauges, and
  // the error of the newest entry of the dead-letter stream (polled with
  // the gauges).
  [[nodiscard]] ui::RedisView view() const;

  [[nodiscard]] std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  void poll_stream(const std::stop_token& stop);

  const Config config_;
  std::shared_ptr<spdlog::logger> log_;
  crew::StreamSource source_;
  // From XINFO GROUPS; -1 while unknown.
  std::atomic<std::int64_t> lag_{-1};
  std::atomic<std::int64_t> pending_{-1};
  std::atomic<std::int64_t> dead_letters_{-1};  // XLEN of the dead-letter stream
  mutable std::mutex last_dead_mu_;
  std::string last_dead_error_;  // guarded by last_dead_mu_
  std::jthread poller_;
};

}  // namespace crewd

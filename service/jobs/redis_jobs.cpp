#include "jobs/redis_jobs.hpp"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <sys/time.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string_view>

#include "jobs/job_runner.hpp"
#include "logging.hpp"

namespace crewd {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
using namespace std::chrono_literals;

// How often the stream gauges are refreshed.
constexpr auto kStreamPollInterval = 1s;

bool is_decimal(std::string_view s) {
  return !s.empty() && s.size() <= 19 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

crew::JobResult run_entry(const crew::Job& entry, const std::stop_token& stop,
                          const JobLimits& limits) {
  const auto parsed = parse_job_fields(entry.fields, limits);
  if (const auto* e = std::get_if<ParseError>(&parsed)) {
    return {false, "invalid job: " + e->message};
  }
  const JobRequest& job = std::get<JobRequest>(parsed);
  const auto start = Clock::now();
  const auto end = start + std::chrono::milliseconds(job.ms);
  const auto deadline = start + std::chrono::milliseconds(job.timeout_ms);
  // Stopped by a shutdown: the source leaves the entry pending.
  if (!run_job_until(job, std::min(end, deadline), stop)) return {false, "stopped"};
  if (deadline <= end) {
    return {false,
            "the job ran past its deadline (timeout_ms " + std::to_string(job.timeout_ms) + ")"};
  }
  return {
      true,
      Json{{"name", job.name}, {"kind", std::string(to_string(job.kind))}, {"ms", job.ms}}.dump()};
}

struct ContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;
using Reply = std::unique_ptr<redisReply, ReplyFree>;

Reply command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return Reply(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

std::string_view text_of(const redisReply* r) {
  return r == nullptr || r->str == nullptr ? std::string_view{} : std::string_view(r->str, r->len);
}

// "host:port" as host and port; an address without a colon (none
// configured: redis.address is empty when Redis is off) as itself and 0.
std::pair<std::string, int> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return {address, 0};
  int port = 0;
  std::from_chars(address.data() + colon + 1, address.data() + address.size(), port);
  return {address.substr(0, colon), port};
}

prometheus::ClientMetric metric(double value, prometheus::MetricType type,
                                std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

}  // namespace

std::variant<JobRequest, ParseError> parse_job_fields(
    const std::vector<std::pair<std::string, std::string>>& fields, const JobLimits& limits) {
  // As the JSON body POST /api/v1/jobs would get, so that one parser holds
  // the rules: numbers become numbers, everything else stays a string (and
  // is refused with that field's message).
  Json doc = Json::object();
  for (const auto& [key, value] : fields) {
    std::uint64_t n = 0;
    if ((key == "ms" || key == "timeout_ms") && is_decimal(value) &&
        std::from_chars(value.data(), value.data() + value.size(), n).ec == std::errc{}) {
      doc[key] = n;
    } else {
      doc[key] = value;
    }
  }
  return parse_job_request(doc.dump(-1, ' ', false, Json::error_handler_t::replace), limits);
}

// redis.priority's range (settings.cpp) is the jobs pool's levels.
static_assert(kJobPriorityLevels == 3);

crew::StreamSourceOptions stream_source_options(const Config& config) {
  const auto [host, port] = split_address(config.redis.address);
  const Config::Redis& r = config.redis;
  return {.host = host,
          .port = port,
          .password = r.password,
          .stream = r.stream,
          .group = r.group,
          .consumer = r.consumer,
          .results_stream = r.results_stream,
          .dead_letter_stream = r.dead_letter_stream,
          .max_in_flight = r.in_flight != 0 ? r.in_flight : config.jobs.workers,
          .max_batch = r.batch,
          .claim_idle = r.claim_idle,
          .max_attempts = r.max_attempts,
          .retry_backoff = r.retry_backoff,
          // Each job enforces its own timeout_ms (run_entry); the pool's
          // deadline is only the outer bound.
          .job_timeout = std::chrono::milliseconds(config.jobs.limits.max_timeout_ms) + 1s,
          .priority = static_cast<std::uint8_t>(r.priority),
          .max_entry_bytes = r.max_entry_bytes,
          .max_entry_fields = r.max_entry_fields};
}

RedisJobs::RedisJobs(const Config& config, crew::Pool& jobs, std::shared_ptr<spdlog::logger> log)
    : config_(config),
      log_(log),
      source_(
          jobs,
          [&] {
            crew::StreamSourceOptions o = stream_source_options(config);
            o.logger = std::make_shared<CrewLog>(log, config.log_level);
            return o;
          }(),
          [limits = config.jobs.limits](const crew::Job& entry, std::stop_token stop) {
            return run_entry(entry, stop, limits);
          }) {}

RedisJobs::~RedisJobs() {
  stop();
  if (poller_.joinable()) poller_.join();
}

void RedisJobs::start() {
  if (poller_.joinable()) return;
  const crew::StreamSourceOptions& o = source_.options();
  log_->info("consuming stream {} (group {}) at redis {} as consumer {}, at most {} jobs in flight",
             o.stream, o.group, config_.redis.address, o.consumer, o.max_in_flight);
  source_.start();
  poller_ = std::jthread([this](std::stop_token stop) { poll_stream(stop); });
}

void RedisJobs::stop() noexcept {
  source_.stop();
  // Not joined here: a poll waiting on an unresponsive Redis (up to 2 s)
  // must not delay the shutdown sequence; the destructor joins.
  poller_.request_stop();
}

bool RedisJobs::connected() const noexcept { return source_.connected(); }

crew::StreamSourceStats RedisJobs::stats() const { return source_.stats(); }

ui::RedisView RedisJobs::view() const {
  const crew::StreamSourceStats s = source_.stats();
  ui::RedisView v{.connected = s.connected,
                  .lag = lag_.load(),
                  .pending = pending_.load(),
                  .in_flight = s.in_flight,
                  .succeeded = s.succeeded,
                  .retried = s.retried,
                  .dead_lettered = s.dead_lettered,
                  .last_dead_letter_error = {}};
  std::lock_guard lock(last_dead_mu_);
  v.last_dead_letter_error = last_dead_error_;
  return v;
}

// XINFO GROUPS and XLEN on a connection of their own, so that a slow reply
// never delays a job; the gauges go unknown (-1) while Redis does not answer.
void RedisJobs::poll_stream(const std::stop_token& stop) {
  const crew::StreamSourceOptions& o = source_.options();
  Context ctx;
  while (!stop.stop_requested()) {
    std::int64_t lag = -1;
    std::int64_t pending = -1;
    std::int64_t dead_letters = -1;
    if (!ctx) {
      timeval tv{1, 0};
      ctx.reset(redisConnectWithTimeout(o.host.c_str(), o.port, tv));
      if (ctx && ctx->err == 0) {
        redisSetTimeout(ctx.get(), tv);
        if (!o.password.empty()) {
          const Reply r = command(ctx.get(), {"AUTH", o.password});
          if (!r || r->type == REDIS_REPLY_ERROR) ctx.reset();
        }
      } else {
        ctx.reset();
      }
    }
    if (ctx) {
      const Reply r = command(ctx.get(), {"XINFO", "GROUPS", o.stream});
      if (!r) {
        ctx.reset();  // connection lost: reconnect on the next round
      } else if (r->type == REDIS_REPLY_ARRAY) {
        for (std::size_t g = 0; g < r->elements; ++g) {
          const redisReply* info = r->element[g];
          if (info->type != REDIS_REPLY_ARRAY) continue;
          std::int64_t g_lag = -1;
          std::int64_t g_pending = -1;
          bool ours = false;
          for (std::size_t k = 0; k + 1 < info->elements; k += 2) {
            const std::string_view key = text_of(info->element[k]);
            const redisReply* v = info->element[k + 1];
            if (key == "name") ours = text_of(v) == o.group;
            // lag is nil when Redis cannot tell (entries deleted mid-stream).
            if (key == "lag" && v->type == REDIS_REPLY_INTEGER) g_lag = v->integer;
            if (key == "pending" && v->type == REDIS_REPLY_INTEGER) g_pending = v->integer;
          }
          if (ours) {
            lag = g_lag;
            pending = g_pending;
          }
        }
      }
    }
    if (ctx) {
      // 0 for a stream that does not exist (yet).
      const Reply r = command(ctx.get(), {"XLEN", o.dead_letter_stream});
      if (!r) {
        ctx.reset();
      } else if (r->type == REDIS_REPLY_INTEGER) {
        dead_letters = r->integer;
      }
    }
    // The newest dead letter's error, for the console.
    if (ctx) {
      const Reply r =
          command(ctx.get(), {"XREVRANGE", o.dead_letter_stream, "+", "-", "COUNT", "1"});
      if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 1) {
        const redisReply* entry = r->element[0];
        if (entry->type == REDIS_REPLY_ARRAY && entry->elements == 2 &&
            entry->element[1]->type == REDIS_REPLY_ARRAY) {
          const redisReply* fields = entry->element[1];
          for (std::size_t k = 0; k + 1 < fields->elements; k += 2) {
            if (text_of(fields->element[k]) != "error") continue;
            std::lock_guard lock(last_dead_mu_);
            last_dead_error_.assign(text_of(fields->element[k + 1]).substr(0, 256));
          }
        }
      }
    }
    lag_.store(lag);
    pending_.store(pending);
    dead_letters_.store(dead_letters);
    (void)sleep_until(Clock::now() + kStreamPollInterval, stop);
  }
}

std::vector<prometheus::MetricFamily> RedisJobs::Collect() const {
  using prometheus::MetricType;
  const crew::StreamSourceStats s = source_.stats();
  const auto d = [](std::uint64_t v) { return static_cast<double>(v); };
  std::vector<prometheus::MetricFamily> out;
  out.push_back({"crewd_redis_connected",
                 "Whether crewd is connected to Redis (1) or reconnecting (0)",
                 MetricType::Gauge,
                 {metric(s.connected ? 1 : 0, MetricType::Gauge)}});
  out.push_back({"crewd_redis_reconnects_total",
                 "Reconnections to Redis after a lost connection",
                 MetricType::Counter,
                 {metric(d(s.reconnects), MetricType::Counter)}});
  out.push_back({"crewd_redis_entries_total",
                 "Stream entries taken: read new (XREADGROUP) or claimed from another consumer "
                 "(XAUTOCLAIM)",
                 MetricType::Counter,
                 {metric(d(s.read), MetricType::Counter, {{"how", "read"}}),
                  metric(d(s.claimed), MetricType::Counter, {{"how", "claimed"}})}});
  out.push_back({"crewd_redis_jobs_total",
                 "Stream jobs settled here: succeeded, dead_lettered (after the last attempt), "
                 "left_pending (stopped before completing)",
                 MetricType::Counter,
                 {metric(d(s.succeeded), MetricType::Counter, {{"outcome", "succeeded"}}),
                  metric(d(s.dead_lettered), MetricType::Counter, {{"outcome", "dead_lettered"}}),
                  metric(d(s.left_pending), MetricType::Counter, {{"outcome", "left_pending"}})}});
  out.push_back({"crewd_redis_job_retries_total",
                 "Failed attempts of stream jobs retried here",
                 MetricType::Counter,
                 {metric(d(s.retried), MetricType::Counter)}});
  out.push_back({"crewd_redis_job_refusals_total",
                 "Stream jobs the jobs pool refused or shed, held and submitted again after a "
                 "backoff",
                 MetricType::Counter,
                 {metric(d(s.refused), MetricType::Counter)}});
  out.push_back({"crewd_redis_jobs_in_flight",
                 "Stream jobs taken and not yet settled",
                 MetricType::Gauge,
                 {metric(d(s.in_flight), MetricType::Gauge)}});
  const std::vector<prometheus::ClientMetric::Label> labels = {{"stream", config_.redis.stream},
                                                               {"group", config_.redis.group}};
  if (const std::int64_t lag = lag_.load(); lag >= 0) {
    out.push_back({"crewd_redis_stream_lag",
                   "Entries of the stream not yet delivered to the consumer group",
                   MetricType::Gauge,
                   {metric(static_cast<double>(lag), MetricType::Gauge, labels)}});
  }
  if (const std::int64_t pending = pending_.load(); pending >= 0) {
    out.push_back({"crewd_redis_stream_pending",
                   "Entries delivered to the consumer group and not yet acknowledged",
                   MetricType::Gauge,
                   {metric(static_cast<double>(pending), MetricType::Gauge, labels)}});
  }
  if (const std::int64_t dead = dead_letters_.load(); dead >= 0) {
    out.push_back({"crewd_redis_dead_letters",
                   "Entries in the dead-letter stream: jobs that failed their last attempt, from "
                   "every instance",
                   MetricType::Gauge,
                   {metric(static_cast<double>(dead), MetricType::Gauge,
                           {{"stream", config_.redis.dead_letter_stream}})}});
  }
  return out;
}

}  // namespace crewd

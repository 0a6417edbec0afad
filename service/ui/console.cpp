// crewd's operations console: the snapshot (service/ui/console.hpp).
#include "ui/console.hpp"

#include <prometheus/histogram.h>

#include <algorithm>
#include <condition_variable>
#include <nlohmann/json.hpp>
#include <utility>

namespace crewd::ui {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double ms_of(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
// Milliseconds to a tenth, so that the JSON stays short.
double tenth(double ms) { return static_cast<double>(static_cast<std::int64_t>(ms * 10)) / 10; }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

Json series_json(const PoolSeries& s) {
  Json succeeded = Json::array(), failed = Json::array(), cancelled = Json::array(),
       timed_out = Json::array(), rejected = Json::array(), p50 = Json::array(),
       p99 = Json::array(), busy = Json::array();
  for (const SeriesPoint& p : s.points()) {
    succeeded.push_back(p.outcomes.succeeded);
    failed.push_back(p.outcomes.failed);
    cancelled.push_back(p.outcomes.cancelled);
    timed_out.push_back(p.outcomes.timed_out);
    rejected.push_back(p.outcomes.rejected);
    p50.push_back(p.wait_p50_us);
    p99.push_back(p.wait_p99_us);
    busy.push_back(p.busy);
  }
  return Json{{"succeeded", std::move(succeeded)}, {"failed", std::move(failed)},
              {"cancelled", std::move(cancelled)}, {"timed_out", std::move(timed_out)},
              {"rejected", std::move(rejected)},   {"wait_p50_us", std::move(p50)},
              {"wait_p99_us", std::move(p99)},     {"busy", std::move(busy)}};
}

std::string dump(const Json& j) {
  // replace: a string holding invalid UTF-8 must not turn into an exception.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < 64; ++i) {
    const auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

nlohmann::ordered_json outcomes_json(const crew::OutcomeCounts& o) {
  return Json{{"succeeded", o.succeeded},
              {"failed", o.failed},
              {"cancelled", o.cancelled},
              {"timed_out", o.timed_out},
              {"rejected", o.rejected}};
}

nlohmann::ordered_json pool_json(const crew::Pool& p, const crew::PoolStats& st,
                                 const crew::CoroutineTasks& co) {
  return Json{{"name", std::string(p.name())},
              {"state", std::string(crew::to_string(st.state))},
              {"workers", st.workers},
              {"busy", st.busy},
              {"idle", st.idle},
              {"max_workers", st.max_workers},
              {"queued", st.queued},
              {"queue_capacity", p.options().queue_capacity},
              {"blocked_submitters", st.blocked_submitters},
              {"submitted", st.submitted},
              {"outcomes", outcomes_json(st.outcomes)},
              {"abandoned", st.abandoned},
              {"workers_replaced", st.workers_replaced},
              {"coroutines", co.live},
              {"suspended", co.suspended.size()}};
}

std::string_view to_string(StopPhase p) noexcept {
  switch (p) {
    case StopPhase::serving:
      return "serving";
    case StopPhase::halting:
      return "halting";
    case StopPhase::admission_closed:
      return "admission_closed";
    case StopPhase::pools_stopping:
      return "pools_stopping";
    case StopPhase::pools_stopped:
      return "pools_stopped";
  }
  return "?";
}

SnapshotQuery parse_snapshot_query(std::string_view target) {
  SnapshotQuery q;
  const auto mark = target.find('?');
  if (mark == std::string_view::npos) return q;
  std::string_view rest = target.substr(mark + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const auto eq = pair.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = pair.substr(0, eq);
    if (key == "outcome") q.filter.outcome = percent_decode(pair.substr(eq + 1));
    if (key == "name") q.filter.name = percent_decode(pair.substr(eq + 1));
  }
  return q;
}

Console::Console(const Config& config) : config_(config), book_(config.ui.history) {
  snapshot_seconds_ =
      &prometheus::BuildHistogram()
           .Name("crewd_ui_snapshot_seconds")
           .Help("Time to build one snapshot of the operations console")
           .Register(*registry_)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                            0.005, 0.01, 0.025, 0.05});
}

Console::~Console() { stop(); }

void Console::attach(crew::Pool& compute, crew::Pool& jobs) {
  compute_ = &compute;
  jobs_ = &jobs;
  sampler_ = std::jthread([this](const std::stop_token& stop) { sample_loop(stop); });
}

void Console::set_redis(std::function<RedisView()> view) { redis_ = std::move(view); }

void Console::stop() noexcept {
  if (sampler_.joinable()) {
    sampler_.request_stop();
    sampler_.join();
  }
}

void Console::sample_loop(const std::stop_token& stop) {
  std::mutex mu;
  std::condition_variable_any cv;
  auto next = Clock::now();
  while (!stop.stop_requested()) {
    next += std::chrono::seconds(1);
    {
      std::unique_lock lock(mu);
      if (cv.wait_until(lock, stop, next, [] { return false; })) break;
    }
    if (stop.stop_requested()) break;
    compute_series_->sample(compute_->stats());
    jobs_series_->sample(jobs_->stats());
    // Behind by more than a step (a suspended process): no burst of samples.
    if (Clock::now() - next > std::chrono::seconds(1)) next = Clock::now();
  }
}

void Console::stop_phase(StopPhase phase) {
  std::lock_guard lock(stop_mu_);
  if (phase == StopPhase::halting) halted_at_ = Clock::now();
  phase_ = phase;
}

void Console::pools_stopping(Clock::time_point escalate_at, Clock::time_point deadline) {
  std::lock_guard lock(stop_mu_);
  phase_ = StopPhase::pools_stopping;
  escalate_at_ = escalate_at;
  deadline_ = deadline;
}

void Console::pool_report(std::string_view pool, const crew::ShutdownReport& report) {
  std::lock_guard lock(stop_mu_);
  reports_.push_back({std::string(pool), report});
  phase_ = StopPhase::pools_stopped;
}

void Console::wait_report_seen(Clock::duration bound) {
  const auto start = Clock::now();
  const auto last = std::chrono::nanoseconds(last_served_ns_.load());
  if (last.count() == 0 || start.time_since_epoch() - last > std::chrono::seconds(5)) return;
  while (!reports_served_.load() && Clock::now() - start < bound) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string Console::snapshot(const SnapshotQuery& query, const HttpView& http) {
  const auto t0 = Clock::now();
  const std::size_t rows = config_.ui.snapshot_rows;
  Json doc;
  doc["version"] = 1;
  doc["uptime_s"] = static_cast<std::int64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(t0 - started_).count());
  doc["read_only"] = config_.ui.read_only;
  doc["http"] = Json{{"halting", http.halting},
                     {"connections", http.connections},
                     {"admitted_in_flight", http.admitted_in_flight}};

  // Pools, and the running tasks from their worker snapshots and their
  // suspended coroutine tasks (a sleep or call job waiting).
  Json pools = Json::array();
  Json running = Json::array();
  std::size_t running_total = 0;
  for (crew::Pool* p : {compute_, jobs_}) {
    if (p == nullptr) continue;
    const crew::CoroutineTasks coroutines = crew::coroutine_tasks(*p);
    pools.push_back(pool_json(*p, p->stats(), coroutines));
    const std::vector<crew::WorkerInfo> workers = p->workers();
    std::vector<std::uint64_t> ids;
    for (const auto& w : workers) {
      if (w.task.id != 0) ids.push_back(w.task.id);
    }
    for (const auto& c : coroutines.suspended) ids.push_back(c.task.id);
    const auto known = p == jobs_ ? book_.find(ids) : std::map<std::uint64_t, LiveJob>{};
    const PoolSeries& series = p == jobs_ ? *jobs_series_ : *compute_series_;
    for (const auto& w : workers) {
      // Written-off workers are listed from the write-offs below.
      if (w.state == crew::WorkerState::abandoned) continue;
      if (w.state != crew::WorkerState::busy && w.task.id == 0) continue;
      ++running_total;
      if (running.size() >= rows) continue;
      const double run_ms = ms_of(w.running_for);
      Json row{{"pool", std::string(p->name())},
               {"worker", w.id},
               {"task_id", w.task.id},
               {"name", w.task.name},
               {"request_id", w.task.correlation_id},
               {"running_ms", tenth(run_ms)},
               {"timeout_ms", nullptr},
               {"left_ms", nullptr},
               {"state", "running"},
               {"replacement", nullptr}};
      if (const auto it = known.find(w.task.id); it != known.end()) {
        row["timeout_ms"] = it->second.timeout_ms;
        row["left_ms"] = tenth(it->second.timeout_ms - run_ms);
        if (run_ms > it->second.timeout_ms) row["state"] = "overdue";
      }
      running.push_back(std::move(row));
    }
    // Suspended: on no worker; running since the job's submission.
    for (const crew::SuspendedCoroutine& c : coroutines.suspended) {
      ++running_total;
      if (running.size() >= rows) continue;
      Json row{{"pool", std::string(p->name())},
               {"worker", nullptr},
               {"task_id", c.task.id},
               {"name", c.task.name},
               {"request_id", c.task.correlation_id},
               {"running_ms", nullptr},
               {"timeout_ms", nullptr},
               {"left_ms", nullptr},
               {"state", "running"},
               {"replacement", nullptr},
               {"waits_on", std::string(c.waits_on)},
               {"suspended_ms", tenth(ms_of(c.suspended_for))}};
      if (const auto it = known.find(c.task.id); it != known.end()) {
        const double run_ms = ms_of(t0 - it->second.submitted);
        row["running_ms"] = tenth(run_ms);
        row["timeout_ms"] = it->second.timeout_ms;
        row["left_ms"] = tenth(it->second.timeout_ms - run_ms);
        if (run_ms > it->second.timeout_ms) row["state"] = "overdue";
      }
      running.push_back(std::move(row));
    }
    // Written off: still running on a thread the pool no longer counts.
    for (const WriteOff& w : series.write_offs()) {
      if (t0 - w.at > std::chrono::seconds(60)) continue;
      ++running_total;
      if (running.size() >= rows) continue;
      running.push_back(Json{{"pool", std::string(p->name())},
                             {"worker", w.worker},
                             {"task_id", w.task_id},
                             {"name", w.task_name},
                             {"request_id", ""},
                             {"running_ms", nullptr},
                             {"timeout_ms", nullptr},
                             {"left_ms", nullptr},
                             {"state", "abandoned"},
                             {"abandoned_ago_ms", tenth(ms_of(t0 - w.at))},
                             {"replacement", w.replacement != 0 ? Json(w.replacement) : Json()}});
    }
  }
  doc["pools"] = std::move(pools);

  JobBook::Listing listing = book_.list(rows, query.filter);
  Json queued = Json::array();
  for (const LiveJob& j : listing.queued) {
    queued.push_back(Json{{"task_id", j.task_id},
                          {"name", j.name},
                          {"kind", std::string(to_string(j.kind))},
                          {"queued_ms", tenth(ms_of(t0 - j.submitted))},
                          {"timeout_ms", j.timeout_ms}});
  }
  Json recent = Json::array();
  for (const JobOutcome& o : listing.recent) {
    recent.push_back(Json{{"task_id", o.task_id},
                          {"name", o.name},
                          {"kind", std::string(to_string(o.kind))},
                          {"outcome", o.outcome},
                          {"reason", o.reason},
                          {"request_id", o.request_id},
                          {"queue_ms", o.queue_ms < 0 ? Json() : Json(tenth(o.queue_ms))},
                          {"run_ms", o.run_ms < 0 ? Json() : Json(tenth(o.run_ms))},
                          {"ended_ago_ms", tenth(ms_of(t0 - o.ended))}});
  }

  doc["series"] = Json{{"step_s", 1},
                       {"compute", series_json(*compute_series_)},
                       {"jobs", series_json(*jobs_series_)}};

  {
    std::lock_guard lock(stop_mu_);
    if (phase_ == StopPhase::serving) {
      doc["shutdown"] = nullptr;
    } else {
      Json s{{"phase", std::string(to_string(phase_))},
             {"since_ms", tenth(ms_of(t0 - halted_at_))},
             {"mode", std::string(crew::to_string(config_.shutdown.mode))},
             {"escalate_in_ms", nullptr},
             {"deadline_in_ms", nullptr}};
      if (phase_ == StopPhase::pools_stopping) {
        s["escalate_in_ms"] = tenth(ms_of(escalate_at_ - t0));
        s["deadline_in_ms"] = tenth(ms_of(deadline_ - t0));
      }
      Json reports = Json::array();
      for (const Report& r : reports_) {
        reports.push_back(
            Json{{"pool", r.pool},
                 {"mode", std::string(crew::to_string(r.report.mode))},
                 {"escalated", r.report.escalated},
                 {"elapsed_ms", tenth(ms_of(r.report.elapsed))},
                 {"during", outcomes_json(r.report.during)},
                 {"lifetime", outcomes_json(r.report.lifetime)},
                 {"abandoned", r.report.abandoned.size() + r.report.abandoned_unnamed}});
      }
      if (!reports_.empty()) reports_served_.store(true);
      s["reports"] = std::move(reports);
      doc["shutdown"] = std::move(s);
    }
  }

  if (redis_) {
    const RedisView r = redis_();
    doc["redis"] = Json{{"connected", r.connected},
                        {"lag", r.lag < 0 ? Json() : Json(r.lag)},
                        {"pending", r.pending < 0 ? Json() : Json(r.pending)},
                        {"in_flight", r.in_flight},
                        {"succeeded", r.succeeded},
                        {"retried", r.retried},
                        {"dead_lettered", r.dead_lettered},
                        {"last_dead_letter_error", r.last_dead_letter_error}};
  } else {
    doc["redis"] = nullptr;
  }

  // The byte cap: the longest list loses half its rows until the whole fits
  // (a few passes at most: each list holds at most ui.snapshot_rows rows).
  std::size_t running_rows = running.size();
  std::size_t queued_rows = queued.size();
  std::size_t recent_rows = recent.size();
  std::string body;
  for (;;) {
    const auto cut = [](Json& list, std::size_t n) {
      Json out = Json::array();
      for (std::size_t i = 0; i < n && i < list.size(); ++i) out.push_back(list[i]);
      return out;
    };
    doc["running"] = cut(running, running_rows);
    doc["queued"] = cut(queued, queued_rows);
    doc["recent"] = cut(recent, recent_rows);
    doc["totals"] = Json{{"running", running_total},
                         {"queued", listing.queued_total},
                         {"recent", listing.recent_total}};
    doc["omitted"] = Json{{"running", running_total - running_rows},
                          {"queued", listing.queued_total - queued_rows},
                          {"recent", listing.recent_total - recent_rows}};
    const double build_ms = ms_of(Clock::now() - t0);
    doc["cost"] = Json{{"build_ms", build_ms},
                       {"previous_build_ms", last_build_ms_.load()},
                       {"previous_bytes", last_bytes_.load()},
                       {"max_bytes", config_.ui.snapshot_bytes},
                       {"max_rows", rows}};
    body = dump(doc);
    if (body.size() <= config_.ui.snapshot_bytes) break;
    std::size_t* longest = &recent_rows;
    if (queued_rows > *longest) longest = &queued_rows;
    if (running_rows > *longest) longest = &running_rows;
    if (*longest == 0) break;  // the rest alone is over the cap: sent as it is
    *longest /= 2;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  snapshot_seconds_->Observe(seconds);
  last_build_ms_.store(seconds * 1000);
  last_bytes_.store(body.size());
  last_served_ns_.store(now_ns());
  return body;
}

}  // namespace crewd::ui

// service/ui/console.hpp: crewd's operations console (GET /ui; docs/crewd.md,
// "Console"): what the page shows, gathered for its snapshot.
//
// The page (console_page.hpp) polls GET /api/v1/ui/snapshot, which
// snapshot() builds on the I/O thread that serves it from
//   - each pool's stats() and workers() (the running tasks),
//   - the JobBook (jobs not yet ended, with their deadlines, and the
//     recent outcomes),
//   - each pool's PoolSeries (five minutes at 1 s, sampled by the
//     console's own thread; the write-offs),
//   - the shutdown as main.cpp reports it (phase, deadlines, reports),
//   - the Redis source, when there is one.
// A snapshot holds at most ui.snapshot_rows rows per list and
// ui.snapshot_bytes bytes, and says how many rows it left out; the time to
// build it is exported as crewd_ui_snapshot_seconds and shown. No worker
// of a pool ever waits for the console: the observers add to atomics,
// everything else runs on the I/O threads and the sampler thread.
//
// Lifetime: built before the pools (their observers are its series), then
// attach()ed to them; stop the sampler (destroy the console, or stop())
// before the pools are destroyed.
//
// Thread safety: all member functions are thread-safe except attach(),
// called once before serving.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <crew/coro.hpp>
#include <crew/pool.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "ui/job_book.hpp"
#include "ui/pool_series.hpp"

namespace crewd::ui {

// Where crewd's stop is (main.cpp reports each step).
enum class StopPhase : std::uint8_t {
  serving,
  halting,           // SIGTERM: /readyz 503, requests still admitted
  admission_closed,  // new work refused; admitted requests are handed over
  pools_stopping,    // the pools' shutdown runs (escalation at its timeout)
  pools_stopped,     // the reports are in; answering the last requests
};
[[nodiscard]] std::string_view to_string(StopPhase p) noexcept;

// A pool's stats() as JSON, as the snapshot and GET /api/v1/pools show
// them: state, workers (busy, idle, max), queued and the queue's capacity,
// blocked submitters, submitted, outcomes, abandoned, workers replaced;
// and its coroutine tasks (crew::coroutine_tasks): live (spawned, not
// ended) and suspended now.
[[nodiscard]] nlohmann::ordered_json pool_json(const crew::Pool& pool, const crew::PoolStats& stats,
                                               const crew::CoroutineTasks& coroutines);
[[nodiscard]] nlohmann::ordered_json outcomes_json(const crew::OutcomeCounts& counts);

// The Redis source as the console shows it.
struct RedisView {
  bool connected = false;
  std::int64_t lag = -1;      // -1: unknown
  std::int64_t pending = -1;  // -1: unknown
  std::size_t in_flight = 0;
  std::uint64_t succeeded = 0;
  std::uint64_t retried = 0;
  std::uint64_t dead_lettered = 0;
  std::string last_dead_letter_error;  // empty: none yet
};

// What the snapshot's caller adds from the HTTP server.
struct HttpView {
  bool halting = false;
  std::size_t connections = 0;
  std::size_t admitted_in_flight = 0;
};

struct SnapshotQuery {
  HistoryFilter filter;
};
// The query string of GET /api/v1/ui/snapshot: outcome=..., name=...
// (percent-decoded; unknown keys ignored; values cut to 64 bytes).
[[nodiscard]] SnapshotQuery parse_snapshot_query(std::string_view target);

class Console {
 public:
  explicit Console(const Config& config);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // The observers to install in the pools' options.
  [[nodiscard]] std::shared_ptr<PoolSeries> compute_series() const { return compute_series_; }
  [[nodiscard]] std::shared_ptr<PoolSeries> jobs_series() const { return jobs_series_; }
  // Starts the sampler thread; the pools must outlive stop().
  void attach(crew::Pool& compute, crew::Pool& jobs);
  // `view` is called on the I/O threads while serving a snapshot.
  void set_redis(std::function<RedisView()> view);
  // Stops the sampler thread. Idempotent.
  void stop() noexcept;

  [[nodiscard]] JobBook& jobs() noexcept { return book_; }
  [[nodiscard]] const Config::Ui& settings() const noexcept { return config_.ui; }
  // crewd_ui_snapshot_seconds.
  [[nodiscard]] std::shared_ptr<prometheus::Collectable> metrics() const { return registry_; }

  // The stop as it happens (main's thread).
  void stop_phase(StopPhase phase);
  void pools_stopping(std::chrono::steady_clock::time_point escalate_at,
                      std::chrono::steady_clock::time_point deadline);
  void pool_report(std::string_view pool, const crew::ShutdownReport& report);
  // After the reports: waits until a snapshot holding them has been served,
  // so that an open page shows them, for at most `bound`, and not at all
  // when no page asked for a snapshot in the last 5 s. Blocks main's thread.
  void wait_report_seen(std::chrono::steady_clock::duration bound);

  // The snapshot's JSON (docs/crewd.md, "Console").
  [[nodiscard]] std::string snapshot(const SnapshotQuery& query, const HttpView& http);

 private:
  struct Report {
    std::string pool;
    crew::ShutdownReport report;
  };
  void sample_loop(const std::stop_token& stop);

  const Config config_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  JobBook book_;
  std::shared_ptr<PoolSeries> compute_series_ = std::make_shared<PoolSeries>();
  std::shared_ptr<PoolSeries> jobs_series_ = std::make_shared<PoolSeries>();
  crew::Pool* compute_ = nullptr;  // set by attach(), then fixed
  crew::Pool* jobs_ = nullptr;
  std::function<RedisView()> redis_;

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Histogram* snapshot_seconds_ = nullptr;
  std::atomic<double> last_build_ms_{0};
  std::atomic<std::size_t> last_bytes_{0};
  std::atomic<std::int64_t> last_served_ns_{0};

  mutable std::mutex stop_mu_;  // the stop's fields below
  StopPhase phase_ = StopPhase::serving;
  std::chrono::steady_clock::time_point halted_at_{};
  std::chrono::steady_clock::time_point escalate_at_{};
  std::chrono::steady_clock::time_point deadline_{};
  std::vector<Report> reports_;
  std::atomic<bool> reports_served_{false};

  std::jthread sampler_;  // last: stopped first
};

}  // namespace crewd::ui

// service/ui/pool_series.hpp: what the console knows of a pool beyond its
// stats(): the last five minutes at one-second steps (outcomes per second,
// queue-wait p50 and p99, busy workers) and the workers written off with
// their replacements.
//
// PoolSeries is an observer of its pool (PoolOptions::observers): a started
// task adds one to a bucket of a queue-wait histogram (relaxed atomic
// adds, no lock, no allocation); a write-off and a replacement, rare,
// take a small mutex of its own. sample() reads the pool's stats() and that
// histogram once a second (the console's sampler thread), never on a worker.
//
// Thread safety: the observer callbacks run on the pool's threads; sample()
// on one thread at a time; the readers (points, write_offs) on any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <crew/observer.hpp>
#include <crew/pool.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace crewd::ui {

// One second of a pool.
struct SeriesPoint {
  crew::OutcomeCounts outcomes;   // tasks that ended in that second
  std::uint32_t wait_p50_us = 0;  // queue wait of the tasks that started in it
  std::uint32_t wait_p99_us = 0;  // (upper bounds of half-octave buckets)
  std::uint32_t busy = 0;         // busy workers at its end
};

// A worker written off with its task still running.
struct WriteOff {
  std::uint64_t worker = 0;
  std::uint64_t task_id = 0;
  std::string task_name;
  std::chrono::steady_clock::time_point at;
  std::uint64_t replacement = 0;  // the worker started in its place; 0: none yet
};

class PoolSeries final : public crew::Observer {
 public:
  static constexpr std::size_t kPoints = 300;  // five minutes at 1 s
  static constexpr std::size_t kWriteOffs = 32;

  PoolSeries() = default;

  [[nodiscard]] std::uint32_t events() const noexcept override {
    return task_started | worker_events;
  }
  void on_task_started(const crew::TaskEvent& task,
                       std::chrono::nanoseconds queue_wait) noexcept override;
  void on_worker_abandoned(std::string_view pool, std::uint64_t worker,
                           const crew::TaskEvent& task) noexcept override;
  void on_worker_replaced(std::string_view pool, std::uint64_t worker) noexcept override;

  // Closes one second: `stats` is the pool's now.
  void sample(const crew::PoolStats& stats);
  // The points, the oldest first (at most kPoints).
  [[nodiscard]] std::vector<SeriesPoint> points() const;
  // The last write-offs, the oldest first (at most kWriteOffs).
  [[nodiscard]] std::vector<WriteOff> write_offs() const;

  // The bucket of a queue wait, and a bucket's upper bound: half octaves
  // from 1 us (bucket 0: below 1 us) to about 70 minutes.
  static constexpr std::size_t kBuckets = 64;
  [[nodiscard]] static std::size_t bucket_of(std::chrono::nanoseconds wait) noexcept;
  [[nodiscard]] static std::uint32_t bucket_upper_us(std::size_t bucket) noexcept;
  // The q-quantile (0..1) of a histogram's counts, as a bucket's upper bound.
  [[nodiscard]] static std::uint32_t quantile_us(const std::array<std::uint64_t, kBuckets>& counts,
                                                 double q) noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, kBuckets> waits_{};  // since the start

  // sample()'s thread; points_ also read under mu_.
  mutable std::mutex mu_;
  std::array<std::uint64_t, kBuckets> last_waits_{};
  crew::OutcomeCounts last_outcomes_;
  bool primed_ = false;
  std::deque<SeriesPoint> points_;
  std::deque<WriteOff> write_offs_;
  // Replacements heard before their write-off: the pool's supervisor
  // announces a write-off after its locks are released, and the worker
  // started in its place may report first. Paired with the next write-off
  // within kPairWindow, then forgotten (a replacement of a worker that
  // died has no write-off).
  struct Unclaimed {
    std::uint64_t worker;
    std::chrono::steady_clock::time_point at;
  };
  static constexpr std::chrono::seconds kPairWindow{5};
  std::deque<Unclaimed> unclaimed_;
};

}  // namespace crewd::ui

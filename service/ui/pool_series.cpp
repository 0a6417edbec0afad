// A pool's series and write-offs for the console (service/ui/pool_series.hpp).
#include "ui/pool_series.hpp"

#include <bit>
#include <cmath>

namespace crewd::ui {

std::size_t PoolSeries::bucket_of(std::chrono::nanoseconds wait) noexcept {
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(wait.count(), 0));
  if (ns < 1000) return 0;
  const std::uint64_t us = ns / 1000;                            // >= 1
  const auto octave = static_cast<int>(std::bit_width(us)) - 1;  // 2^octave <= us
  // The upper half of the octave: us >= 1.5 * 2^octave.
  const bool upper = octave > 0 ? ((us >> (octave - 1)) & 1u) != 0 : false;
  const std::size_t b = 1 + 2 * static_cast<std::size_t>(octave) + (upper ? 1 : 0);
  return std::min(b, kBuckets - 1);
}

std::uint32_t PoolSeries::bucket_upper_us(std::size_t bucket) noexcept {
  if (bucket == 0) return 1;
  const std::size_t octave = (bucket - 1) / 2;
  const bool upper = ((bucket - 1) % 2) != 0;
  if (octave >= 31) return UINT32_MAX;
  const std::uint64_t base = std::uint64_t{1} << octave;
  const std::uint64_t hi = upper ? 2 * base : base + (base + 1) / 2;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(hi, UINT32_MAX));
}

std::uint32_t PoolSeries::quantile_us(const std::array<std::uint64_t, kBuckets>& counts,
                                      double q) noexcept {
  std::uint64_t total = 0;
  for (const auto c : counts) total += c;
  if (total == 0) return 0;
  const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total)));
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < kBuckets; ++b) {
    seen += counts[b];
    if (seen >= std::max<std::uint64_t>(rank, 1)) return bucket_upper_us(b);
  }
  return bucket_upper_us(kBuckets - 1);
}

void PoolSeries::on_task_started(const crew::TaskEvent& /*task*/,
                                 std::chrono::nanoseconds queue_wait) noexcept {
  waits_[bucket_of(queue_wait)].fetch_add(1, std::memory_order_relaxed);
}

void PoolSeries::on_worker_abandoned(std::string_view /*pool*/, std::uint64_t worker,
                                     const crew::TaskEvent& task) noexcept {
  try {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    while (!unclaimed_.empty() && now - unclaimed_.front().at > kPairWindow) unclaimed_.pop_front();
    std::uint64_t replacement = 0;
    if (!unclaimed_.empty()) {
      replacement = unclaimed_.front().worker;
      unclaimed_.pop_front();
    }
    write_offs_.push_back({.worker = worker,
                           .task_id = task.id,
                           .task_name = std::string(task.name),
                           .at = now,
                           .replacement = replacement});
    while (write_offs_.size() > kWriteOffs) write_offs_.pop_front();
  } catch (...) {  // out of memory: the console misses one write-off
  }
}

void PoolSeries::on_worker_replaced(std::string_view /*pool*/, std::uint64_t worker) noexcept {
  std::lock_guard lock(mu_);
  for (WriteOff& w : write_offs_) {
    if (w.replacement == 0) {
      w.replacement = worker;
      return;
    }
  }
  try {
    unclaimed_.push_back({worker, std::chrono::steady_clock::now()});
    while (unclaimed_.size() > kWriteOffs) unclaimed_.pop_front();
  } catch (...) {  // out of memory: the console misses one replacement
  }
}

void PoolSeries::sample(const crew::PoolStats& stats) {
  std::array<std::uint64_t, kBuckets> now{};
  for (std::size_t b = 0; b < kBuckets; ++b) now[b] = waits_[b].load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  if (primed_) {
    std::array<std::uint64_t, kBuckets> delta{};
    for (std::size_t b = 0; b < kBuckets; ++b) delta[b] = now[b] - last_waits_[b];
    const crew::OutcomeCounts& o = stats.outcomes;
    const crew::OutcomeCounts& l = last_outcomes_;
    points_.push_back({.outcomes = {.succeeded = o.succeeded - l.succeeded,
                                    .failed = o.failed - l.failed,
                                    .cancelled = o.cancelled - l.cancelled,
                                    .timed_out = o.timed_out - l.timed_out,
                                    .rejected = o.rejected - l.rejected},
                       .wait_p50_us = quantile_us(delta, 0.50),
                       .wait_p99_us = quantile_us(delta, 0.99),
                       .busy = static_cast<std::uint32_t>(stats.busy)});
    while (points_.size() > kPoints) points_.pop_front();
  }
  primed_ = true;
  last_waits_ = now;
  last_outcomes_ = stats.outcomes;
}

std::vector<SeriesPoint> PoolSeries::points() const {
  std::lock_guard lock(mu_);
  return {points_.begin(), points_.end()};
}

std::vector<WriteOff> PoolSeries::write_offs() const {
  std::lock_guard lock(mu_);
  return {write_offs_.begin(), write_offs_.end()};
}

}  // namespace crewd::ui

// src/base/cpu_pressure.hpp (private): whether the machine's CPUs are
// contended, so that idle workers spin only briefly while threads wait for
// a CPU (kContendedSpinNs, PoolOptions::spin_when_contended).
//
// A spinning worker keeps a CPU busy for up to PoolOptions::spin after its
// last task. On a machine with a CPU to spare that costs nobody anything
// and saves the next task a wake-up. On a machine whose CPUs are all wanted
// (crewd with its clients on the same CPUs, other busy services) the spin
// takes the CPU from threads that would have made progress, the producers
// of the very tasks it waits for among them: crewd at `wrk -c8` served 0.53
// of its inline handler's requests through the compute pool with the
// default spin, 0.77 without any, in one run (docs/crewd.md,
// "Throughput").
//
// The measure is Linux's pressure stall information: /proc/pressure/cpu,
// whose "some" line counts the microseconds during which at least one
// runnable thread waited for a CPU. Its share of wall time is averaged
// over readings kPeriodNs apart (an exponential average that rises fast
// and falls slowly); the CPUs count as contended from kOnShare on and
// until the average falls under kOffShare. The gap between the two, and the
// slow fall, keep the answer steady: the spin's own CPU is part of what
// others wait for, so the share drops when spinning stops (at `wrk -c8`,
// from about 87 % to a mean of about 52 %, with runs of 4 ms readings
// near 0 among ones near 90 %), and a single threshold or a symmetric
// average would switch the spin back on every few readings.
//
// Who touches what: any worker about to spin calls cpus_contended(); the
// one that finds a reading due and takes the gauge's lock (try_lock) reads
// the file and updates the filter; the others get the last answer (a
// relaxed load).
// Without the file (not Linux, pressure stall information disabled in the
// kernel, or unreadable) the CPUs never count as contended.
#pragma once

#include <cstdint>
#include <string_view>

namespace crew::detail {

// The filter, apart from the file: fed cumulative stall totals, says
// whether the CPUs are contended. Not thread-safe (cpus_contended() holds
// the gauge's lock around it).
class CpuContention {
 public:
  static constexpr std::int64_t kPeriodNs = 4'000'000;
  // A reading after a longer gap (no worker spun meanwhile: the pool was
  // idle, or every worker busy) starts the average afresh.
  static constexpr std::int64_t kRestartNs = 100'000'000;
  // A reading's weight in the average when its share is above the average
  // (contention is believed at once) and when below (freedom is believed
  // after a stretch of quiet readings).
  static constexpr double kRiseWeight = 0.25;
  static constexpr double kFallWeight = 1.0 / 16;
  static constexpr double kOnShare = 0.6;
  static constexpr double kOffShare = 0.3;

  // One reading: the cumulative "some" total in microseconds at now_ns.
  // Returns whether the CPUs count as contended. A total that went
  // backwards (another source) restarts the average.
  bool update(std::int64_t now_ns, std::int64_t total_us) noexcept;
  // The current average share of time some thread waited, 0 to 1.
  [[nodiscard]] double share() const noexcept { return share_; }

 private:
  bool primed_ = false;  // a previous reading exists
  bool fresh_ = true;    // the next share replaces the average
  bool contended_ = false;
  double share_ = 0;
  std::int64_t last_ns_ = 0;
  std::int64_t last_us_ = 0;
};

// The "total=" value of the "some" line of a pressure file ("some
// avg10=1.00 avg60=0.50 avg300=0.10 total=123456"), or -1 if there is none.
std::int64_t parse_pressure_total(std::string_view text) noexcept;

// Whether the machine's CPUs are contended, from the readings of
// /proc/pressure/cpu (at most one every CpuContention::kPeriodNs, made by
// the caller that finds one due). `now_ns` is now_ns(). Never blocks:
// a caller that finds another reading gets the last answer. Safe from any
// thread.
bool cpus_contended(std::int64_t now_ns) noexcept;

// For tests: the source of the cumulative stall total in microseconds
// (negative: unavailable), instead of /proc/pressure/cpu; nullptr restores
// the file. Also forgets every reading. Safe from any thread.
using PressureSource = std::int64_t (*)() noexcept;
void set_pressure_source_for_testing(PressureSource source) noexcept;

}  // namespace crew::detail

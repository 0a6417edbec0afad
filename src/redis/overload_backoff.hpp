// src/redis/overload_backoff.hpp (private): when a StreamSource submits
// again after the pool refused or shed one of its jobs (the policy is in
// include/crew/stream_source.hpp, "overload backoff"). A value with no
// lock of its own: the source keeps it under its mutex, and the reader
// thread and the workers that report an unrun job reach it only there.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

namespace crew::detail {

class OverloadBackoff {
 public:
  using Clock = std::chrono::steady_clock;

  // `lo` and `hi` bound every backoff (lo <= hi, both positive; the
  // options' validation checks them); `seed` seeds the jitter.
  OverloadBackoff(Clock::duration lo, Clock::duration hi, std::uint32_t seed)
      : lo_(lo), hi_(hi), jitter_(seed) {}

  // Nothing is read or submitted before this (the epoch: no backoff yet).
  [[nodiscard]] Clock::time_point until() const noexcept { return until_; }
  [[nodiscard]] bool paused(Clock::time_point now) const noexcept { return now < until_; }

  // A refusal or a shed at `now`: starts a backoff unless one lasts. Its
  // length is the pool's queue-wait `estimate` or twice the last one,
  // whichever is longer, within [lo, hi], less up to a quarter at random so
  // that instances refused together do not come back together. A refusal
  // during a backoff does not lengthen it (the jobs refused together count
  // once).
  void refused(Clock::time_point now, Clock::duration estimate) {
    if (paused(now)) return;
    last_ = std::clamp(std::max(last_ * 2, estimate), lo_, hi_);
    std::uniform_int_distribution<Clock::rep> quarter(0, last_.count() / 4);
    until_ = now + last_ - Clock::duration(quarter(jitter_));
  }

  // An admission succeeded: the next refusal starts again from the
  // estimate (or `lo`), not from double the last backoff.
  void admitted() noexcept { last_ = Clock::duration::zero(); }

 private:
  Clock::duration lo_, hi_;
  Clock::duration last_{};
  Clock::time_point until_{};
  std::minstd_rand jitter_;
};

}  // namespace crew::detail

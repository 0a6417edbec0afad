// crew/detail/overload_control.hpp: detail::OverloadControl, a pool's
// overload controller (crew/overload.hpp says what it does). PoolCore holds
// one only when PoolOptions::overload.enabled; the inline parts here are
// what the submission path calls, the rest is in src/engine/overload_control.cpp.
//
// Who touches what (docs: crew/overload.hpp):
//   submitters: admit() (the admission count, the limit, the refusal
//     counters) and time_this() (whether this task's queue wait is timed)
//   whoever is done with an admitted task: release(), on its own stripe
//   a thread starting an admitted task whose wait is timed: on_start(), on
//     its own stripe (an untimed start touches nothing); the one that finds the interval
//     over sums the stripes up under roll_ (try-lock: the others go on) and
//     publishes the limit and the overloaded state
//   readers (stats, crewd's I/O threads): read(), hint()
//
// What the controller costs a pool that is not overloaded: the admission
// count is split in two, admissions (one atomic, written by submitters)
// and returns (one counter per stripe, written by the threads that end
// tasks), so workers never write a line the submitters write. admit()
// checks admissions minus the returns last summed up, an over-estimate of
// the admitted work by the tickets returned since, and sums the returns
// again whenever that estimate reaches the limit, or a deadline admission
// would refuse, and every kResum admissions: a refusal always comes from
// a fresh sum, never from the stale part. The queue wait of a task is
// timed (two clock reads, a histogram bucket) for every task while the
// pool is overloaded or its start rate is low (under kDenseStarts per
// interval), else for one task in kSampleEvery per submitting thread: the
// percentile is then estimated from a sample of at least kDenseStarts /
// kSampleEvery waits per interval, and the start rate as kSampleEvery
// times the timed starts (an untimed start costs nothing; a task admitted
// timed and started after the switch counts kSampleEvery times). The
// window (histogram, minimum) is kept per stripe and summed up once per
// interval.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/spin_lock.hpp"
#include "crew/detail/thread_annotations.hpp"
#include "crew/overload.hpp"

namespace crew::detail {

class OverloadControl {
 public:
  // `floor` and `ceiling` bound the limit (the caller resolved the
  // defaults); `workers` is the pool's max_workers (the backlog estimate
  // takes that many admitted tasks as running).
  OverloadControl(const OverloadOptions& o, std::size_t floor, std::size_t ceiling,
                  std::size_t workers, std::int64_t now) noexcept;
  OverloadControl(const OverloadControl&) = delete;
  OverloadControl& operator=(const OverloadControl&) = delete;

  // Takes one admission ticket, or says why not (nothing taken then).
  // `queue_timeout_ns`: the task's queue timeout, 0 for none.
  // `may_displace`: a refusal at the limit is not counted yet; the caller
  // either displaces a lower priority's task (admit_displacing) or counts
  // it (note_refused_early).
  OverloadReason admit(std::int64_t queue_timeout_ns, bool may_displace = false) noexcept {
    const std::int64_t a = admits_.fetch_add(1, std::memory_order_relaxed) + 1;
    // At least the admitted work: returns since the last sum are not in it.
    std::int64_t n = a - returned_seen_.load(std::memory_order_relaxed);
    const std::int64_t limit = limit_.load(std::memory_order_relaxed);
    if (n >= limit || a % kResum == 0) [[unlikely]]
      n = a - sum_returns();
    if (n > peak_.load(std::memory_order_relaxed)) peak_.store(n, std::memory_order_relaxed);
    if (n >= limit) [[unlikely]] {
      if (!limit_hit_.load(std::memory_order_relaxed))
        limit_hit_.store(true, std::memory_order_relaxed);
      if (n > limit) {
        admits_.fetch_sub(1, std::memory_order_relaxed);
        if (!may_displace) refused_limit_.fetch_add(1, std::memory_order_relaxed);
        return OverloadReason::limit;
      }
    }
    if (queue_timeout_ns != 0 && deadline_admission_ && backlog_wait_ns(n - 1) > queue_timeout_ns)
        [[unlikely]] {
      if (backlog_wait_ns(a - sum_returns() - 1) > queue_timeout_ns) {
        admits_.fetch_sub(1, std::memory_order_relaxed);
        refused_deadline_.fetch_add(1, std::memory_order_relaxed);
        return OverloadReason::deadline;
      }
    }
    return OverloadReason::none;
  }
  // Returns a ticket: its task ended, or its cell was dropped.
  void release() noexcept { stripe().returned.fetch_add(1, std::memory_order_relaxed); }
  // Takes the ticket of a task this submission displaced (shed, reason
  // priority): past the limit, as the displaced one held it.
  void admit_displacing() noexcept {
    admits_.fetch_add(1, std::memory_order_relaxed);
    shed_priority_.fetch_add(1, std::memory_order_relaxed);
  }

  // A standing queue: CoDel's overloaded state, or the limit was reached
  // this interval. Admitted tasks then queue newest first (queues.hpp), and
  // a higher priority at the limit displaces a lower one's newest task.
  [[nodiscard]] bool standing() const noexcept {
    return overloaded_.load(std::memory_order_relaxed) ||
           limit_hit_.load(std::memory_order_relaxed);
  }

  // Whether the queue wait of a task being admitted by this thread is to
  // be timed (see the overview); an untimed one is never shed by CoDel.
  [[nodiscard]] bool time_this() noexcept {
    static thread_local std::uint32_t admitted_here = 0;
    return dense_.load(std::memory_order_relaxed) || ++admitted_here % kSampleEvery == 1;
  }

  // A timed admitted task about to start at `now` after waiting `wait_ns`
  // since admission. True: shed it (CoDel) instead of running it; the
  // caller calls note_shed() once it did.
  bool on_start(std::int64_t wait_ns, std::int64_t now) noexcept {
    record(wait_ns, now);
    if (now >= window_end_.load(std::memory_order_relaxed)) [[unlikely]]
      roll(now);
    if (wait_ns <= shed_after_ns_ || !overloaded_.load(std::memory_order_relaxed)) return false;
    // CoDel's backlog guard: with no more admitted work than workers there
    // is no queue to shed from, only a late start (a busy machine's
    // scheduling delay, a worker being started): run it.
    return admitted() > workers_;
  }
  // Whether on_end() wants the run times of timed admitted tasks.
  [[nodiscard]] bool watches_run_time() const noexcept { return run_signal_; }
  // A timed admitted task ran for `run_ns` (the run-time signal).
  void on_end(std::int64_t run_ns) noexcept {
    Stripe& s = stripe();
    s.run_hist[bucket_of(run_ns)].fetch_add(1, std::memory_order_relaxed);
    std::int64_t m = s.run_min.load(std::memory_order_relaxed);
    while (run_ns < m && !s.run_min.compare_exchange_weak(m, run_ns, std::memory_order_relaxed)) {
    }
  }
  // An admitted task whose wait was not timed is about to start: counted
  // for the start rate only.
  void note_shed() noexcept { shed_codel_.fetch_add(1, std::memory_order_relaxed); }
  // A caller acted on hint() and refused a submission itself.
  void note_refused_early() noexcept { refused_limit_.fetch_add(1, std::memory_order_relaxed); }

  // What admit() would say now, without taking a ticket (a cheap early
  // answer, such as crewd's from a request's head), and the queue wait a
  // task admitted now would see.
  [[nodiscard]] OverloadHint hint() const noexcept {
    const std::int64_t n = admitted();
    OverloadHint h;
    if (n >= limit_.load(std::memory_order_relaxed)) h.reason = OverloadReason::limit;
    h.wait_estimate = std::chrono::nanoseconds(
        std::max(last_high_.load(std::memory_order_relaxed), backlog_wait_ns(n)));
    return h;
  }

  [[nodiscard]] OverloadStats read() const noexcept;

  // The bucket of a queue wait in the window's histogram: four per power
  // of two of microseconds (about 19 % apart), and its upper bound.
  static constexpr std::size_t kBuckets = 96;
  [[nodiscard]] static std::size_t bucket_of(std::int64_t wait_ns) noexcept;
  [[nodiscard]] static std::int64_t bucket_upper_ns(std::size_t bucket) noexcept;

  // Sums up the window ending at `now` (also called by tests with a
  // controlled clock). Does nothing if another thread is at it.
  void roll(std::int64_t now) noexcept;
  // Records one queue wait, of a task started at `now`, in the current
  // window (the calling thread's stripe of it).
  void record(std::int64_t wait_ns, std::int64_t now) noexcept {
    Stripe& s = stripe();
    s.hist[bucket_of(wait_ns)].fetch_add(1, std::memory_order_relaxed);
    if (s.first.load(std::memory_order_relaxed) == 0) {
      std::int64_t none = 0;
      s.first.compare_exchange_strong(none, now, std::memory_order_relaxed);
    }
    std::int64_t m = s.min.load(std::memory_order_relaxed);
    while (wait_ns < m && !s.min.compare_exchange_weak(m, wait_ns, std::memory_order_relaxed)) {
    }
  }

  // Sampling: every task is timed below this many starts per interval...
  static constexpr std::int64_t kDenseStarts = 1024;
  // ...and above it one in this many per submitting thread.
  static constexpr std::uint32_t kSampleEvery = 16;
  // admit() sums the returned tickets up at least every kResum admissions.
  static constexpr std::int64_t kResum = 64;

 private:
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  // One thread's share of the counts (threads share one when there are
  // more than kStripes): written by the threads that map to it, summed up
  // by roll() and the readers.
  struct alignas(kCacheLine) Stripe {
    std::atomic<std::int64_t> returned{0};  // tickets returned, ever
    std::atomic<std::int64_t> min{kNone};   // the window's shortest timed wait
    std::atomic<std::int64_t> first{0};     // when its first timed task started (0: none yet)
    std::array<std::atomic<std::uint32_t>, kBuckets> hist{};
    // The run-time signal's window (untouched when it is off).
    std::atomic<std::int64_t> run_min{kNone};
    std::array<std::atomic<std::uint32_t>, kBuckets> run_hist{};
  };
  static constexpr std::size_t kStripes = 8;
  Stripe& stripe() noexcept { return stripes_[stripe_index()]; }
  // Constant-initialised, so that a read needs no guard for the first use.
  static std::size_t stripe_index() noexcept {
    static std::atomic<std::size_t> next{0};
    thread_local std::size_t index = kStripes;
    if (index == kStripes) [[unlikely]]
      index = next.fetch_add(1, std::memory_order_relaxed) % kStripes;
    return index;
  }
  // Sums the returned tickets up and publishes the sum for admit()'s estimate.
  std::int64_t sum_returns() noexcept {
    std::int64_t r = 0;
    for (const Stripe& s : stripes_) r += s.returned.load(std::memory_order_relaxed);
    returned_seen_.store(r, std::memory_order_relaxed);
    return r;
  }
  // Admitted tasks not yet ended, now (a racy snapshot).
  [[nodiscard]] std::int64_t admitted() const noexcept {
    std::int64_t r = 0;
    for (const Stripe& s : stripes_) r += s.returned.load(std::memory_order_relaxed);
    return admits_.load(std::memory_order_relaxed) - r;
  }

  void roll_locked(std::int64_t now) noexcept CREW_REQUIRES(roll_);
  // The limit the run-time signal allows for `in_use` from this window's
  // run times, or -1 while they are within its bound; updates the baseline.
  double run_time_cut(double in_use) noexcept CREW_REQUIRES(roll_);
  // The upper bound of the bucket where the `percentile_` of `counts` falls.
  [[nodiscard]] std::int64_t percentile_of(const std::array<std::uint32_t, kBuckets>& counts,
                                           std::uint64_t total) const noexcept;
  // The wait of a task admitted behind `ahead` others: those beyond the
  // workers, at the last interval's start rate (0 while none is known).
  [[nodiscard]] std::int64_t backlog_wait_ns(std::int64_t ahead) const noexcept {
    const std::int64_t per_start = ns_per_start_.load(std::memory_order_relaxed);
    const std::int64_t queued = ahead - workers_;
    return queued > 0 && per_start > 0 ? queued * per_start : 0;
  }

  // Read-mostly: the submitters' and starters' view.
  const std::int64_t target_ns_;
  const std::int64_t shed_after_ns_;  // 2 x target
  const std::int64_t interval_ns_;
  const double percentile_;
  const bool adaptive_;
  const bool deadline_admission_;
  const bool run_signal_;
  const double run_factor_;
  const std::int64_t workers_;
  const double floor_;
  const double ceiling_;
  std::atomic<std::int64_t> limit_;
  std::atomic<std::int64_t> window_end_;
  std::atomic<bool> overloaded_{false};
  std::atomic<bool> dense_{true};               // time every task (see time_this)
  std::atomic<std::int64_t> ns_per_start_{0};   // 0: no start in the last interval
  std::atomic<std::int64_t> returned_seen_{0};  // the returns at a recent sum

  // Written by every submission from outside the pool.
  alignas(kCacheLine) std::atomic<std::int64_t> admits_{0};  // tickets taken, ever
  std::atomic<bool> limit_hit_{false};                       // the limit was reached this interval
  std::atomic<std::int64_t> peak_{0};  // the most admitted at once this interval

  // Returns and the window, by thread.
  std::array<Stripe, kStripes> stripes_{};

  // Summed up by roll() under roll_.
  alignas(kCacheLine) SpinLock roll_;
  double limit_exact_ CREW_GUARDED_BY(roll_);
  std::int64_t window_start_ CREW_GUARDED_BY(roll_);
  std::int64_t run_base_ CREW_GUARDED_BY(roll_) = 0;  // 0: none yet
  std::atomic<std::int64_t> last_run_high_{0};
  std::atomic<std::int64_t> last_run_base_{0};
  std::atomic<std::int64_t> last_min_{0};
  std::atomic<std::int64_t> last_high_{0};

  std::atomic<std::uint64_t> refused_limit_{0};
  std::atomic<std::uint64_t> refused_deadline_{0};
  std::atomic<std::uint64_t> shed_codel_{0};
  std::atomic<std::uint64_t> shed_priority_{0};
};

}  // namespace crew::detail

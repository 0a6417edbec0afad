// The overload controller's window and the interval's sum-up: CoDel's
// overloaded state and the adaptive admission limit (crew/overload.hpp).
#include "crew/detail/overload_control.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "crew/detail/mutex.hpp"

namespace crew::detail {

void leave_live_controllers(std::uint64_t token) noexcept;

namespace {

// One signal's window summed up over the stripes (and emptied there).
struct Drained {
  std::array<std::uint32_t, OverloadControl::kBuckets> counts{};
  std::uint64_t total = 0;
  std::int64_t min = std::numeric_limits<std::int64_t>::max();

  void take(std::array<std::atomic<std::uint32_t>, OverloadControl::kBuckets>& hist,
            std::atomic<std::int64_t>& shortest) noexcept {
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const std::uint32_t c = hist[i].exchange(0, std::memory_order_relaxed);
      counts[i] += c;
      total += c;
    }
    min = std::min(min, shortest.exchange(std::numeric_limits<std::int64_t>::max(),
                                          std::memory_order_relaxed));
  }
};

// Controllers' ids and threads' tokens: never reused, never 0.
std::atomic<std::uint64_t> g_next_controller{1};
std::atomic<std::uint64_t> g_next_thread{1};

std::uint64_t thread_token() noexcept {
  static thread_local std::uint64_t token = 0;
  if (token == 0) token = g_next_thread.fetch_add(1, std::memory_order_relaxed);
  return token;
}

// The live controllers, for the thread-exit hook: linked and unlinked
// under g_live_mu, walked under it by an exiting thread, so that a
// controller is never destroyed while that thread gives its ledger back.
Mutex g_live_mu;
OverloadControl* g_live_head CREW_GUARDED_BY(g_live_mu) = nullptr;

// Armed by a thread's first bind_ledger(): as the thread exits (its
// thread_local destructors), it gives back its ledgers in every
// controller still alive. A worker of a pool has left that pool's
// controller already (worker.cpp); what it finds there is nothing.
struct LedgerExitHook {
  std::uint64_t token = 0;  // 0: not armed
  ~LedgerExitHook() {
    if (token != 0) leave_live_controllers(token);
  }
};
thread_local LedgerExitHook t_ledger_exit;

}  // namespace

void leave_live_controllers(std::uint64_t token) noexcept {
  MutexLock lock(g_live_mu);
  for (OverloadControl* c = g_live_head; c != nullptr; c = c->next_live_) c->leave_as(token);
}

OverloadControl::OverloadControl(const OverloadOptions& o, std::size_t floor, std::size_t ceiling,
                                 std::size_t workers, std::int64_t now) noexcept
    : target_ns_(o.target.count()),
      shed_after_ns_(2 * o.target.count()),
      early_cut_ns_(4 * o.target.count()),
      interval_ns_(o.interval.count()),
      percentile_(o.percentile),
      adaptive_(o.adaptive_limit),
      deadline_admission_(o.deadline_admission),
      run_signal_(o.run_time_signal && o.adaptive_limit),
      run_factor_(o.run_time_factor),
      workers_(static_cast<std::int64_t>(workers)),
      floor_(static_cast<double>(floor)),
      ceiling_(static_cast<double>(ceiling)),
      limit_(static_cast<std::int64_t>(run_signal_ ? floor : ceiling)),
      window_end_(now + o.interval.count()),
      id_(g_next_controller.fetch_add(1, std::memory_order_relaxed)),
      limit_exact_(static_cast<double>(run_signal_ ? floor : ceiling)),
      slow_start_(run_signal_),
      window_start_(now) {
  MutexLock lock(g_live_mu);
  next_live_ = g_live_head;
  if (g_live_head != nullptr) g_live_head->prev_live_ = this;
  g_live_head = this;
}

OverloadControl::~OverloadControl() {
  MutexLock lock(g_live_mu);
  if (prev_live_ != nullptr) {
    prev_live_->next_live_ = next_live_;
  } else {
    g_live_head = next_live_;
  }
  if (next_live_ != nullptr) next_live_->prev_live_ = prev_live_;
}

std::size_t OverloadControl::bucket_of(std::int64_t wait_ns) noexcept {
  const std::uint64_t us = wait_ns > 0 ? static_cast<std::uint64_t>(wait_ns) / 1000 : 0;
  if (us < 4) return static_cast<std::size_t>(us);
  const unsigned msb = static_cast<unsigned>(std::bit_width(us)) - 1;  // >= 2
  const std::size_t quarter = static_cast<std::size_t>((us >> (msb - 2)) & 3u);
  return std::min<std::size_t>(4 * (msb - 1) + quarter, kBuckets - 1);
}

std::int64_t OverloadControl::bucket_upper_ns(std::size_t bucket) noexcept {
  if (bucket < 4) return static_cast<std::int64_t>(bucket + 1) * 1000;
  const unsigned msb = static_cast<unsigned>(bucket / 4) + 1;
  const std::uint64_t quarter = bucket % 4;
  // Waits up to the next bucket's first microsecond.
  const std::uint64_t next_us = ((4 + quarter + 1) << (msb - 2));
  return static_cast<std::int64_t>(next_us) * 1000;
}

OverloadReason OverloadControl::admit_counted(std::int64_t queue_timeout_ns,
                                              bool may_displace) noexcept {
  const std::int64_t a = admits_.fetch_add(1, std::memory_order_relaxed) + 1;
  // At least the admitted work: returns since the last sum are not in
  // it, nor is the credit threads hold.
  std::int64_t n = a - returned_seen_.load(std::memory_order_relaxed);
  const std::int64_t limit = limit_.load(std::memory_order_relaxed);
  if (n >= limit || a % kResum == 0) [[unlikely]] {
    // Near the limit: no thread takes credit until the next interval, and
    // what they hold is given back at their next admission.
    if (n >= limit) stop_credit();
    n = a - sum_unheld();
  }
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
    if (backlog_wait_ns(a - sum_unheld() - 1) > queue_timeout_ns) {
      admits_.fetch_sub(1, std::memory_order_relaxed);
      refused_deadline_.fetch_add(1, std::memory_order_relaxed);
      return OverloadReason::deadline;
    }
  }
  return OverloadReason::none;
}

OverloadControl::Ledger* OverloadControl::bind_ledger() noexcept {
  const std::uint64_t me = thread_token();
  Ledger* found = nullptr;
  for (std::size_t i = 0; i < kLedgers && found == nullptr; ++i) {
    if (owners_[i].load(std::memory_order_relaxed) == me) found = &ledgers_[i];
  }
  for (std::size_t i = 0; i < kLedgers && found == nullptr; ++i) {
    std::uint64_t none = 0;
    // Acquire: what the ledger's last owner wrote (leave() releases it).
    if (owners_[i].load(std::memory_order_relaxed) == 0 &&
        owners_[i].compare_exchange_strong(none, me, std::memory_order_acquire)) {
      owned_.fetch_add(1, std::memory_order_relaxed);
      found = &ledgers_[i];
      t_ledger_exit.token = me;  // gives it back as the thread exits
    }
  }
  ledger_cache() = {.controller = id_, .ledger = found};
  return found;
}

void OverloadControl::leave() noexcept { leave_as(thread_token()); }

void OverloadControl::leave_as(std::uint64_t me) noexcept {
  for (std::size_t i = 0; i < kLedgers; ++i) {
    if (owners_[i].load(std::memory_order_relaxed) != me) continue;
    // Its credit goes back before the ledger does.
    give_back_credit(ledgers_[i], ledgers_[i].credit.load(std::memory_order_relaxed));
    owners_[i].store(0, std::memory_order_release);
    owned_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (ledger_cache().controller == id_) ledger_cache() = {};
}

void OverloadControl::give_back_credit(Ledger& l, std::int64_t left) noexcept {
  if (left <= 0) return;
  // The ledger's credit first, then admits_: a reader in between counts
  // the tickets as admitted (an over-estimate), never twice as free.
  l.credit.store(0, std::memory_order_relaxed);
  admits_.fetch_sub(left, std::memory_order_relaxed);
}

bool OverloadControl::take_credit(Ledger& l, std::int64_t left) noexcept {
  // Taken in an earlier interval (under another limit, with another peak),
  // or the limit was neared since: given back.
  give_back_credit(l, left);
  const std::int64_t epoch = credit_epoch_.load(std::memory_order_relaxed);
  if ((epoch & 1) != 0) return false;
  const std::int64_t limit = limit_.load(std::memory_order_relaxed);
  const Sums s = sum_ledgers();
  returned_seen_.store(s.returned, std::memory_order_relaxed);
  const std::int64_t a = admits_.load(std::memory_order_relaxed);
  // The room left, with every thread's credit counted as admitted: each
  // thread takes at most a 2 x threads-th of it, so that together they
  // hold under half of it, and admitted work stays under the limit while
  // admissions come from credit.
  const std::int64_t threads = std::max<std::int64_t>(owned_.load(std::memory_order_relaxed), 1);
  const std::int64_t k = std::min(kCredit, (limit - (a - s.returned)) / (2 * threads));
  if (k < 2) return false;
  admits_.fetch_add(k, std::memory_order_relaxed);
  l.epoch = epoch;
  l.credit.store(k - 1, std::memory_order_relaxed);      // after admits_: see leave()
  const std::int64_t n = a - s.returned - s.credit + 1;  // with this ticket
  l.top = n + k - 1;
  if (n > peak_.load(std::memory_order_relaxed)) peak_.store(n, std::memory_order_relaxed);
  return true;
}

void OverloadControl::roll(std::int64_t now) noexcept {
  if (!roll_.try_lock()) return;
  if (now >= window_end_.load(std::memory_order_relaxed)) {
    roll_locked(now);
    early_allowed_.store(true, std::memory_order_relaxed);
  }
  roll_.unlock();
}

void OverloadControl::roll_early(std::int64_t now) noexcept {
  const auto ceiling = static_cast<std::int64_t>(std::llround(ceiling_));
  const auto at_ceiling = [&] {
    return adaptive_ && early_allowed_.load(std::memory_order_relaxed) &&
           limit_.load(std::memory_order_relaxed) >= ceiling &&
           now - (window_end_.load(std::memory_order_relaxed) - interval_ns_) >= interval_ns_ / 10;
  };
  if (!at_ceiling()) return;
  if (!roll_.try_lock()) return;
  if (at_ceiling()) {
    early_allowed_.store(false, std::memory_order_relaxed);
    roll_locked(now);
  }
  roll_.unlock();
}

void OverloadControl::roll_locked(std::int64_t now) noexcept {
  Drained waits;
  std::int64_t first = 0;
  std::int64_t dense = 0;
  for (Stripe& s : stripes_) {
    waits.take(s.hist, s.min);
    const std::int64_t f = s.first.exchange(0, std::memory_order_relaxed);
    if (f != 0 && (first == 0 || f < first)) first = f;
    dense += s.dense.exchange(0, std::memory_order_relaxed);
  }
  const std::uint64_t total = waits.total;  // timed starts
  const std::int64_t min = waits.min;
  // Every start was timed while dense_, one in kSampleEvery after it.
  const auto timed = static_cast<std::int64_t>(total);
  const std::int64_t starts = std::min(dense, timed) + std::max<std::int64_t>(timed - dense, 0) *
                                                           static_cast<std::int64_t>(kSampleEvery);
  const std::int64_t elapsed = std::max<std::int64_t>(now - window_start_, 1);
  window_start_ = now;
  window_end_.store(now + interval_ns_, std::memory_order_relaxed);
  const bool hit = limit_hit_.exchange(false, std::memory_order_relaxed);
  const auto peak = static_cast<double>(peak_.exchange(admitted(), std::memory_order_relaxed));
  // A new interval: credit taken before it is given back at its holder's
  // next admission (the limit may change below), and may be taken again.
  std::int64_t e = credit_epoch_.load(std::memory_order_relaxed);
  while (!credit_epoch_.compare_exchange_weak(e, (e | 1) + 1, std::memory_order_relaxed)) {
  }
  if (total == 0) {
    // No timed task started: the signal says nothing new. The start rate
    // is unknown (a backlog estimate from it would be stale), and low:
    // the next tasks are all timed.
    ns_per_start_.store(0, std::memory_order_relaxed);
    dense_.store(true, std::memory_order_relaxed);
    return;
  }
  ns_per_start_.store(std::max<std::int64_t>(elapsed / std::max<std::int64_t>(starts, 1), 1),
                      std::memory_order_relaxed);
  // A bucket's bound can exceed the minimum: the percentile is at least it.
  const std::int64_t high = std::max(percentile_of(waits.counts, total), min);
  last_min_.store(min, std::memory_order_relaxed);
  last_high_.store(high, std::memory_order_relaxed);
  // CoDel: a standing queue, not a burst, when even the shortest wait of a
  // whole interval was over the target. Starts over less than half an
  // interval (the first after an idle spell, whose own wait would
  // otherwise shed it) are no standing queue.
  const bool busy = first != 0 && now - first >= interval_ns_ / 2;
  const bool overloaded = busy && min > target_ns_;
  overloaded_.store(overloaded, std::memory_order_relaxed);
  dense_.store(overloaded || starts < kDenseStarts, std::memory_order_relaxed);
  if (!adaptive_) return;
  const double in_use = std::min(limit_exact_, std::max(peak, floor_));
  const double run_cut = run_signal_ ? run_time_cut(in_use) : -1;
  if (run_cut >= 0) {
    // Tasks ran far longer than their baseline: a hidden queue in the OS
    // run queue. Cut from all in use, the running part included; never
    // raised meanwhile.
    limit_exact_ = std::min(limit_exact_, run_cut);
    slow_start_ = false;
  } else if (high > target_ns_) {
    // Cut by how far the wait is over the target, from what was in use: a
    // limit far above the admitted work (the ceiling it starts at) would
    // otherwise take many intervals to come down while the queue grows.
    // Only its queued part waits: what the workers run is kept, or a pool
    // of many workers would cut below them and leave some idle.
    // With no more in use than workers, nothing waited behind them: the
    // waits came from elsewhere (workers being started, a burst within the
    // interval), and a cut would refuse work idle workers could run.
    const double running = std::min(in_use, static_cast<double>(workers_));
    const double queued = in_use - running;
    if (queued > 0) {
      limit_exact_ = std::max(
          floor_, running + queued * static_cast<double>(target_ns_) / static_cast<double>(high));
      slow_start_ = false;
    }
  } else if (hit) {
    // Up by one; doubled instead during the run-time signal's slow start.
    // That signal sees a hidden queue only in run times, which come when
    // tasks end: a limit starting at the ceiling let a whole interval's
    // arrivals in at once, all then running slower together (64 workers
    // on one CPU at 4x their capacity: the first second's jobs set the
    // run's p99, docs/bench/overload.md). Doubling from the floor reaches
    // the ceiling of a pool that needs it within a few intervals.
    limit_exact_ = std::min(ceiling_, slow_start_ ? 2 * limit_exact_ : limit_exact_ + 1.0);
  }
  // Rounded, never truncated toward 0 or 1: the floor is at least 2.
  limit_.store(static_cast<std::int64_t>(std::llround(limit_exact_)), std::memory_order_relaxed);
}

std::int64_t OverloadControl::percentile_of(const std::array<std::uint32_t, kBuckets>& counts,
                                            std::uint64_t total) const noexcept {
  const auto rank = static_cast<std::uint64_t>(std::ceil(percentile_ * static_cast<double>(total)));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    seen += counts[i];
    if (seen >= rank) return bucket_upper_ns(i);
  }
  return 0;
}

double OverloadControl::run_time_cut(double in_use) noexcept {
  Drained runs;
  for (Stripe& s : stripes_) runs.take(s.run_hist, s.run_min);
  if (runs.total == 0) return -1;
  const std::int64_t min = runs.min;
  const std::int64_t high = std::max(percentile_of(runs.counts, runs.total), min);
  last_run_high_.store(high, std::memory_order_relaxed);
  const bool first = run_base_ == 0;
  if (first || min < run_base_) run_base_ = min;
  const double bound = run_factor_ * static_cast<double>(run_base_);
  const bool over = !first && static_cast<double>(high) > bound;
  // Up slowly, and only while within the bound: a cut interval's minimum is
  // inflated by the very queue the signal sees.
  if (!over && min > run_base_) run_base_ += std::max<std::int64_t>((min - run_base_) / 16, 1);
  last_run_base_.store(run_base_, std::memory_order_relaxed);
  if (!over) return -1;
  return std::max(floor_, in_use * bound / static_cast<double>(high));
}

OverloadStats OverloadControl::read() const noexcept {
  OverloadStats s;
  s.enabled = true;
  s.admitted = static_cast<std::size_t>(std::max<std::int64_t>(admitted(), 0));
  s.limit = static_cast<std::size_t>(limit_.load(std::memory_order_relaxed));
  s.overloaded = overloaded_.load(std::memory_order_relaxed);
  const std::int64_t min = last_min_.load(std::memory_order_relaxed);
  s.wait_min = std::chrono::nanoseconds(min);
  s.wait_high = std::chrono::nanoseconds(last_high_.load(std::memory_order_relaxed));
  const std::int64_t per_start = ns_per_start_.load(std::memory_order_relaxed);
  s.start_rate = per_start > 0 ? 1e9 / static_cast<double>(per_start) : 0;
  s.wait_estimate = hint().wait_estimate;
  s.refused_limit = refused_limit_.load(std::memory_order_relaxed);
  s.refused_deadline = refused_deadline_.load(std::memory_order_relaxed);
  s.shed_codel = shed_codel_.load(std::memory_order_relaxed);
  s.shed_priority = shed_priority_.load(std::memory_order_relaxed);
  s.run_high = std::chrono::nanoseconds(last_run_high_.load(std::memory_order_relaxed));
  s.run_baseline = std::chrono::nanoseconds(last_run_base_.load(std::memory_order_relaxed));
  return s;
}

}  // namespace crew::detail

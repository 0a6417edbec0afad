// crew/detail/overload_control.hpp: detail::OverloadControl, a pool's
// overload controller (crew/overload.hpp says what it does). PoolCore holds
// one only when PoolOptions::overload.enabled; the inline parts here are
// what the submission path calls, the rest is in src/engine/overload_control.cpp.
//
// Who touches what (docs: crew/overload.hpp):
//   submitters: admit() (the admission count, the limit, the refusal
//     counters; the credit in their own ledger) and time_this() (whether
//     this task's queue wait is timed)
//   whoever is done with an admitted task: release(), in its own ledger
//   a thread starting an admitted task whose wait is timed: on_start(), on
//     its own stripe (an untimed start touches nothing); the one that finds the interval
//     over sums the stripes up under roll_ (try-lock: the others go on) and
//     publishes the limit and the overloaded state
//   readers (stats, crewd's I/O threads): read(), hint()
//
// What the controller costs a pool that is not overloaded. Tickets are
// counted in admits_ (taken, ever) and per thread in a ledger of its own
// (kLedgers of them, bound on a thread's first use; every thread gives its
// ledger back when it exits, see leave()): the tickets it returned, and its credit,
// tickets taken from admits_ as a batch and not given yet. A ledger has
// one writer, so neither side takes a locked read-modify-write per task:
//   - far from the limit, a submitter takes up to kCredit tickets at once,
//     at most 1 / (2 x threads with a ledger) of the room left under the
//     limit (credit counted as admitted), and spends them one per admit();
//   - admitted work is admits_ minus the returns and the credit of every
//     ledger (and the returns of threads without one); a refusal always
//     comes from that sum taken fresh, so credit another thread holds is
//     never refused against;
//   - credit is good in the interval it was taken in: a new interval (the
//     limit may change), and the first admission that finds the limit
//     near, end it; its holder gives it back at its next admission. Until
//     then, admitted work may pass the limit by the credit others hold
//     (at most half the room left when it was taken, and only in the
//     moment between the limit being neared and their next admission);
//   - the interval's peak of admitted work (the cut of the limit starts
//     from it) counts, while admissions come from credit, what was admitted
//     when the batch was taken plus the batch spent since, returns not
//     deducted: it may run over the true peak by up to a batch.
// Admissions near the limit, with a queue timeout (the backlog estimate
// needs the count), or from threads without a ledger are counted one by
// one: admit() checks admits_ minus the returns last summed up, an
// over-estimate of the admitted work, and sums the ledgers up again
// whenever that estimate reaches the limit, or a deadline admission would
// refuse, and every kResum admissions. The queue wait of a task is
// timed (two clock reads, a histogram bucket) for every task while the
// pool is overloaded or its start rate is low (under kDenseStarts per
// interval; one thread starting that many switches to sampling at once,
// not at the interval's end), else for one task in kSampleEvery per
// submitting thread: the
// percentile is then estimated from a sample of at least kDenseStarts /
// kSampleEvery waits per interval, and the start rate as kSampleEvery
// times the timed starts (an untimed start costs nothing, and runs as a
// plain task does; a task admitted timed and started after the switch
// counts kSampleEvery times). The window (histogram, minimum) is kept per
// stripe and summed up once per interval.
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
  ~OverloadControl();
  OverloadControl(const OverloadControl&) = delete;
  OverloadControl& operator=(const OverloadControl&) = delete;

  // Takes one admission ticket, or says why not (nothing taken then).
  // `queue_timeout_ns`: the task's queue timeout, 0 for none.
  // `may_displace`: a refusal at the limit is not counted yet; the caller
  // either displaces a lower priority's task (admit_displacing) or counts
  // it (note_refused_early).
  [[gnu::always_inline]] OverloadReason admit(std::int64_t queue_timeout_ns,
                                              bool may_displace = false) noexcept {
    // Far from the limit, a ticket from this thread's credit: no shared
    // write. A task with a queue timeout needs the backlog: counted exactly.
    if (queue_timeout_ns == 0) [[likely]] {
      if (Ledger* l = ledger()) [[likely]] {
        const std::int64_t c = l->credit.load(std::memory_order_relaxed);
        if (c > 0 && l->epoch == credit_epoch_.load(std::memory_order_relaxed)) [[likely]] {
          l->credit.store(c - 1, std::memory_order_relaxed);
          // At most the admitted work: what was admitted when the credit
          // was taken, and all of it spent since (returns not deducted).
          const std::int64_t n = l->top - (c - 1);
          if (n > peak_.load(std::memory_order_relaxed)) peak_.store(n, std::memory_order_relaxed);
          return OverloadReason::none;
        }
        if (take_credit(*l, c)) return OverloadReason::none;
      }
    }
    return admit_counted(queue_timeout_ns, may_displace);
  }
  // Returns a ticket: its task ended, or its cell was dropped.
  [[gnu::always_inline]] void release() noexcept {
    if (Ledger* l = ledger()) [[likely]] {
      // This thread is the ledger's one writer: no read-modify-write.
      l->returned.store(l->returned.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else {
      shared_returned_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // A thread that took tickets or returned some leaves the controller for
  // good (a worker of the pool exiting): its ledger, and the credit in it,
  // go back for another thread. Any other thread with a ledger does the
  // same on its own as it exits, in every controller still alive (a
  // thread-exit hook armed when it binds its first ledger), so that
  // threads that come and go do not use up the kLedgers.
  void leave() noexcept;
  // Threads holding a ledger now (tests).
  [[nodiscard]] std::int64_t ledgers_owned() const noexcept {
    return owned_.load(std::memory_order_relaxed);
  }
  // Takes the ticket of a task this submission displaced (shed, reason
  // priority): past the limit, as the displaced one held it.
  void admit_displacing() noexcept {
    admits_.fetch_add(1, std::memory_order_relaxed);
    shed_priority_.fetch_add(1, std::memory_order_relaxed);
  }

  // A standing queue: CoDel's overloaded state, or the limit was reached
  // this interval. Admitted tasks then queue newest first (queues.hpp), and
  // a higher priority at the limit displaces a lower one's newest task.
  [[nodiscard, gnu::always_inline]] bool standing() const noexcept {
    return overloaded_.load(std::memory_order_relaxed) ||
           limit_hit_.load(std::memory_order_relaxed);
  }

  // Whether the queue wait of a task being admitted by this thread is to
  // be timed (see the overview); an untimed one is never shed by CoDel.
  [[nodiscard, gnu::always_inline]] bool time_this() noexcept {
    static thread_local std::uint32_t admitted_here = 0;
    return dense_.load(std::memory_order_relaxed) || ++admitted_here % kSampleEvery == 1;
  }

  // A timed admitted task about to start at `now` after waiting `wait_ns`
  // since admission. True: shed it (CoDel) instead of running it; the
  // caller calls note_shed() once it did.
  bool on_start(std::int64_t wait_ns, std::int64_t now) noexcept {
    record(wait_ns, now);
    if (now >= window_end_.load(std::memory_order_relaxed)) [[unlikely]] {
      roll(now);
    } else if (wait_ns > early_cut_ns_) [[unlikely]] {
      roll_early(now);
    }
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
  // A task waited over early_cut_ns_ (4 x target) while the adaptive limit
  // stands at its ceiling (it never came down, or rose back): a queue is
  // building from an onset of overload faster than an interval would show,
  // and every arrival until the interval ends would be admitted into it
  // (only to be shed by CoDel an interval later). The window is summed up
  // now, so that the limit is cut from what is admitted, once it has run a
  // tenth of the interval, and at most once until the next whole interval
  // ends; CoDel's own state is decided on whole intervals only
  // (roll_locked's `busy`). Does nothing if another thread is at it.
  void roll_early(std::int64_t now) noexcept;
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
    // Timing every task: once one thread alone started kDenseStarts in this
    // interval, one in kSampleEvery is enough (not while overloaded) from
    // now on, not only from the next interval (a new pool's first one).
    if (dense_.load(std::memory_order_relaxed)) {
      if (s.dense.fetch_add(1, std::memory_order_relaxed) + 1 >= kDenseStarts &&
          !overloaded_.load(std::memory_order_relaxed)) [[unlikely]]
        dense_.store(false, std::memory_order_relaxed);
    }
  }

  // Sampling: every task is timed below this many starts per interval...
  static constexpr std::int64_t kDenseStarts = 4096;
  // ...and above it one in this many per submitting thread.
  static constexpr std::uint32_t kSampleEvery = 64;
  // admit() sums the returned tickets up at least every kResum admissions
  // it counts one by one.
  static constexpr std::int64_t kResum = 64;
  // Tickets a thread takes at once, at most: far from the limit, admit()
  // spends them one by one from the thread's ledger (see the overview).
  static constexpr std::int64_t kCredit = 256;
  // Threads with a ledger of their own, at most; the others count tickets
  // one by one in shared counters.
  static constexpr std::size_t kLedgers = 16;

 private:
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  // One thread's share of the counts (threads share one when there are
  // more than kStripes): written by the threads that map to it, summed up
  // by roll() and the readers.
  struct alignas(kCacheLine) Stripe {
    std::atomic<std::int64_t> min{kNone};  // the window's shortest timed wait
    std::atomic<std::int64_t> first{0};    // when its first timed task started (0: none yet)
    std::atomic<std::int64_t> dense{0};    // of the timed starts, those while dense_
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
  // One thread's tickets: written by its owner alone (plain loads and
  // stores), read by the sums.
  struct alignas(kCacheLine) Ledger {
    std::atomic<std::int64_t> credit{0};    // taken from admits_, not yet given
    std::atomic<std::int64_t> returned{0};  // tickets returned, ever
    std::int64_t epoch = -1;                // credit_epoch_ when the credit was taken
    std::int64_t top = 0;                   // admitted work once all of it is spent
  };
  // The calling thread's ledger, or null when every one has an owner.
  [[gnu::always_inline]] Ledger* ledger() noexcept {
    const LedgerCache& t = ledger_cache();
    if (t.controller == id_) [[likely]]
      return t.ledger;
    return bind_ledger();
  }
  // Which ledger the calling thread last used, and of which controller
  // (by id_, never reused: a destroyed controller's entry matches no other).
  struct LedgerCache {
    std::uint64_t controller = 0;
    Ledger* ledger = nullptr;
  };
  static LedgerCache& ledger_cache() noexcept {
    static thread_local LedgerCache cache;
    return cache;
  }
  Ledger* bind_ledger() noexcept;
  // leave() for the thread of `token` (the calling thread's).
  void leave_as(std::uint64_t token) noexcept;
  // The thread-exit hook: leave_as(token) in every live controller.
  friend void leave_live_controllers(std::uint64_t token) noexcept;
  // Takes a batch of credit into `l` (first giving back the `left` it held
  // from an earlier interval, or from before the limit was neared), and
  // one ticket of it. False near the limit: admit() then counts this
  // ticket one by one.
  bool take_credit(Ledger& l, std::int64_t left) noexcept;
  // Returns the `left` tickets of `l`'s credit (its owner, or a leaving
  // owner) to admits_.
  void give_back_credit(Ledger& l, std::int64_t left) noexcept;
  // admit() for a ticket counted one by one in admits_.
  OverloadReason admit_counted(std::int64_t queue_timeout_ns, bool may_displace) noexcept;
  // Near the limit: no thread spends or takes credit until the next interval.
  void stop_credit() noexcept {
    if ((credit_epoch_.load(std::memory_order_relaxed) & 1) == 0)
      credit_epoch_.fetch_or(1, std::memory_order_relaxed);
  }
  struct Sums {
    std::int64_t returned = 0;  // tickets returned, ever
    std::int64_t credit = 0;    // tickets taken as credit and not given yet
  };
  Sums sum_ledgers() const noexcept {
    Sums s{.returned = shared_returned_.load(std::memory_order_relaxed)};
    for (const Ledger& l : ledgers_) {
      s.returned += l.returned.load(std::memory_order_relaxed);
      s.credit += l.credit.load(std::memory_order_relaxed);
    }
    return s;
  }
  // The tickets taken that no admitted task holds (returned, or credit),
  // summed up now; publishes the returned part for admit()'s estimate
  // (credit is spent without a shared write: a stale sum of it would
  // under-estimate).
  std::int64_t sum_unheld() noexcept {
    const Sums s = sum_ledgers();
    returned_seen_.store(s.returned, std::memory_order_relaxed);
    return s.returned + s.credit;
  }
  // Admitted tasks not yet ended, now (a racy snapshot).
  [[nodiscard]] std::int64_t admitted() const noexcept {
    const Sums s = sum_ledgers();
    return admits_.load(std::memory_order_relaxed) - s.returned - s.credit;
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
  const std::int64_t early_cut_ns_;   // 4 x target (roll_early)
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
  std::atomic<bool> early_allowed_{true};       // roll_early may end this window
  std::atomic<std::int64_t> ns_per_start_{0};   // 0: no start in the last interval
  std::atomic<std::int64_t> returned_seen_{0};  // the returns at a recent sum
  // Credit is good within the interval it was taken in (even: the roll()
  // count x 2), and not at all once odd (stop_credit).
  std::atomic<std::int64_t> credit_epoch_{0};
  const std::uint64_t id_;  // this controller's, for ledger_cache()
  // The list of live controllers the thread-exit hook walks (under its
  // mutex, in overload_control.cpp): linked by the constructor, unlinked
  // by the destructor.
  OverloadControl* prev_live_ = nullptr;
  OverloadControl* next_live_ = nullptr;

  // Written by every submission from outside the pool.
  alignas(kCacheLine) std::atomic<std::int64_t> admits_{0};  // tickets taken, ever
  std::atomic<bool> limit_hit_{false};                       // the limit was reached this interval
  std::atomic<std::int64_t> peak_{0};  // the most admitted at once this interval

  // The window, by thread.
  std::array<Stripe, kStripes> stripes_{};
  // Tickets, by thread: owners_[i] is the token of ledgers_[i]'s thread (0:
  // none), owned_ how many have one.
  std::array<Ledger, kLedgers> ledgers_{};
  alignas(kCacheLine) std::array<std::atomic<std::uint64_t>, kLedgers> owners_{};
  std::atomic<std::int64_t> owned_{0};
  // Tickets returned by threads without a ledger.
  alignas(kCacheLine) std::atomic<std::int64_t> shared_returned_{0};

  // Summed up by roll() under roll_.
  alignas(kCacheLine) SpinLock roll_;
  double limit_exact_ CREW_GUARDED_BY(roll_);
  // With the run-time signal: the limit starts at the floor and doubles
  // each interval it is reached until the first cut (see roll_locked).
  bool slow_start_ CREW_GUARDED_BY(roll_);
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

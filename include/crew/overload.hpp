// crew/overload.hpp: a pool's overload controller (PoolOptions::overload)
// and what it reports (PoolStats::overload).
//
// When more work arrives than a pool can do, a bounded queue alone keeps a
// standing queue: every task waits for the whole queue and most miss their
// deadline while the workers stay busy. The controller keeps the queue wait
// short instead, from one signal whose no-load value is known, zero: the
// time tasks wait between admission and start. Per interval it keeps the
// minimum and a high percentile of that wait, and
//   - CoDel at dequeue: while the minimum of the last interval exceeded
//     `target` (a standing queue, not a burst), a task that waited over
//     twice the target ends `shed` (Errc::overloaded, reason codel) without
//     running, unless no more work is admitted than the pool has workers
//     (then nothing is queued behind it: it waited for a start, on a busy
//     machine or for a worker being started, and shedding it frees nothing);
//   - an adaptive limit on admitted work (queued plus running): when the
//     percentile is above the target, cut to the interval's peak of
//     admitted work with its queued part (beyond max_workers) times
//     target / percentile, raised by one per interval while the
//     limit was reached and the wait is within the target. It starts at
//     the ceiling (with run_time_signal: at the floor, doubled each
//     interval the limit was reached until its first cut). While it
//     stands at the ceiling, a task that waited over 4 x target ends the
//     interval early (once a tenth of it has run; at most once before
//     the next whole interval), so that an onset of overload is cut
//     within milliseconds rather than after a whole interval of
//     arrivals admitted, to be shed by CoDel one interval later. Between a
//     floor (the workers, capped at the usable CPUs, at least 2) and a
//     ceiling (queue capacity plus workers). A submission past the limit
//     is refused at once with Admission::overloaded (reason limit);
//   - optionally, the run time of tasks against its own baseline, for pools
//     with more workers than CPUs (OverloadOptions::run_time_signal);
//   - deadline-aware admission: a task with a queue timeout that the backlog
//     cannot meet at the last interval's start rate is refused (reason
//     deadline).
//   - newest first under a standing queue: while CoDel reports the pool
//     overloaded or the limit was reached in the current interval,
//     admitted tasks queue newest first within their priority level (a
//     stack beside the level's FIFO ring, crew/detail/newest_first.hpp);
//     workers take the newest, and every other pop the level's oldest
//     (the ring's, or with the ring empty the stack's bottom), so what
//     queued before, and the bottom of a stack that never empties, still
//     come up (to run, or to be shed by CoDel). Oldest first again once
//     the stack is empty;
//   - priorities as a moving threshold at the limit: a submission of
//     priority above 0 past the limit displaces the newest task queued
//     newest first at the lowest lower level that has one, which ends
//     `shed` (Errc::overloaded, reason priority), and is admitted in its
//     place. Tasks queued oldest first (before the standing queue, or with
//     the stack full) are not displaced: the FIFO rings give a slot to the
//     consumer that claims the head, so taking from the tail would cost
//     every pop a second claim; shards keep no order to find the newest
//     by; and the rings also hold the pool's own, unticketed submissions
//     (docs/api.md has the detail). CoDel sheds those older tasks instead.
//     A full level's queue is not made room in: the queue is bounded per
//     level, so a lower level's task holds no room of a higher one.
// Only submissions from outside the pool are admitted this way: a task
// submitted by one of the pool's own tasks (fork-join, continuations) is
// part of admitted work and neither counted nor refused. An admitted task
// counts until it is done with (run, shed, dropped), or until it is written
// off (abandon_grace): the pool then replaces its worker, and the thread it
// leaves behind no longer holds a place under the limit, however long its
// callable runs on. The exception is a plain task (no handle, no name, no
// stop token) that a hard shutdown writes off: it holds its place until its
// callable returns, also after a restart(). With admit_coroutines, a coroutine task (crew/coro.hpp)
// spawned from outside the pool is admitted too: refused as a task is, it holds
// its ticket while its start is queued and its first step runs, and gives it
// back when that step suspends or ends (a suspended task holds none, so the
// limit bounds the work queued and running, not the tasks in progress). Its
// start's queue wait feeds the signal, but CoDel never sheds it: an accepted
// coroutine task is `running` from the spawn on (docs/coroutines.md).
//
// Off by default; off, a submission pays one predictable branch. On, a
// pool that is not overloaded pays little for it: once over 4,096 tasks
// start per interval, only one task's queue wait in 64 per submitting
// thread is timed (every task's below that rate and while overloaded), the
// window is kept per thread and summed once per interval, and far from
// the limit a thread takes its admission tickets in batches and counts
// them, and the ones it returns, in a ledger of its own; a refusal always
// comes from a fresh sum of what is admitted
// (crew/detail/overload_control.hpp has the bounds).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "crew/error.hpp"

namespace crew {

struct OverloadOptions {
  bool enabled = false;
  // The queue wait a pool should keep: short tasks (milliseconds) do well
  // with 5 ms / 100 ms (CoDel's defaults scaled to a thread pool); tasks of
  // tens of milliseconds want a target near their own length.
  std::chrono::nanoseconds target = std::chrono::milliseconds(5);
  // How often the signal is summed up and the limit adjusted; also how long
  // the minimum must stay above the target before tasks are shed.
  std::chrono::nanoseconds interval = std::chrono::milliseconds(100);
  // false: CoDel's dequeue drop alone, no admission limit.
  bool adaptive_limit = true;
  // The percentile of the interval's queue waits the limit follows (0, 1].
  double percentile = 0.9;
  // Bounds of the limit; 0 picks the defaults above (floor: max_workers
  // capped at usable CPUs, at least 2; ceiling: queue_capacity x levels +
  // max_workers). A floor below 2 is raised to 2.
  std::size_t min_limit = 0;
  std::size_t max_limit = 0;
  // Refuse, at admission, a task whose queue timeout the backlog cannot
  // meet at the current start rate.
  bool deadline_admission = true;
  // The run-time signal, for pools with more workers than CPUs (64 workers
  // on one CPU): their excess queue hides in the OS run queue, where tasks
  // wait while they count as running, so the queue wait stays short while
  // every task takes longer. When the interval's `percentile` of run times
  // (of the tasks whose wait is timed) exceeds run_time_factor x a
  // baseline, the limit is cut as for the queue wait, but from all that was
  // in use, running included: times factor x baseline / percentile. The
  // baseline is the interval minimum run time: it falls at once to a lower
  // one, and rises by 1/16 of the gap an interval only while the signal is
  // within its bound (a cut interval's minimum is inflated by the cause).
  // A limit at its floor stays there. With this signal the limit starts at
  // its floor and doubles each interval it was reached (slow start) until
  // the first cut, by either signal: run times come only as tasks end, and
  // a limit starting at the ceiling let a whole interval's arrivals run at
  // once, all slower together. Off by default; needs adaptive_limit.
  bool run_time_signal = false;
  double run_time_factor = 2.0;  // > 1
  // Admit coroutine tasks spawned from outside the pool too (see above).
  // Off by default: the limit follows the queue wait of CPU work, and a
  // burst of coroutine starts (microseconds each) queues past the target
  // too: crewd's 500 `sleep` jobs at once under TSan on a loaded machine
  // had 112 refused (503, reason limit) with it on. A service bounds the
  // coroutine tasks it has in progress itself (crewd: jobs.max_in_flight).
  bool admit_coroutines = false;
};

// What the controller did and sees (PoolStats::overload; all zero when off).
struct OverloadStats {
  bool enabled = false;
  // Tasks admitted from outside the pool and not yet ended (queued or running).
  std::size_t admitted = 0;
  std::size_t limit = 0;    // the adaptive limit now (the ceiling without one)
  bool overloaded = false;  // CoDel's state: shedding waits over 2 x target
  // The last interval's minimum and percentile queue wait, and its start
  // rate (tasks per second).
  std::chrono::nanoseconds wait_min{0};
  std::chrono::nanoseconds wait_high{0};
  double start_rate = 0;
  // The queue wait a new task would see: the backlog at the start rate,
  // or the last percentile, whichever is larger (a Retry-After hint).
  std::chrono::nanoseconds wait_estimate{0};
  // Refused at admission (also counted in outcomes.rejected), by reason.
  std::uint64_t refused_limit = 0;
  std::uint64_t refused_deadline = 0;
  // Shed (outcomes.shed), by reason: at dequeue (codel), or displaced by a
  // higher priority's submission at the limit (priority).
  std::uint64_t shed_codel = 0;
  std::uint64_t shed_priority = 0;
  // The run-time signal (zero when off): the last interval's percentile
  // run time and the baseline it is held against.
  std::chrono::nanoseconds run_high{0};
  std::chrono::nanoseconds run_baseline{0};
};

// Pool::overload_hint(): what a submission from outside the pool would meet now.
struct OverloadHint {
  OverloadReason reason = OverloadReason::none;  // limit: it would be refused
  std::chrono::nanoseconds wait_estimate{0};     // OverloadStats::wait_estimate
};

}  // namespace crew

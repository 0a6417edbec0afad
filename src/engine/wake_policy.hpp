// src/engine/wake_policy.hpp (private): WakePolicy, how a pool's idle
// workers spin, sleep and are woken (src/engine/wake.cpp;
// docs/design/wake-ups.md), with its constants: how long a spinner spins,
// when it yields its CPU, when help for a backlog is deferred. The
// engine's alone, so that tuning it rebuilds only the engine.
//
// Who touches what:
//   the sleeper stack  a worker pushes itself (sleep_for_work) and takes
//                      itself off; wakers pop workers (wake_one, wake_all).
//                      All under mu_, which also guards each worker's
//                      WakeSlot::in_idle_stack, its links on the stack
//                      and WakeSlot::waker_cpu. The
//                      counts the submission path reads are the pool's
//                      IdleCounts (crew/detail/idle_counts.hpp).
//   a worker's WakeSlot  the rest of it is its own thread's.
//   the pool's queues, state and worker counts  read; grow() starts a
//                      worker (wake_or_grow).
// Only a worker's own thread spins and sleeps; any thread wakes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "crew/detail/cache_line.hpp"
#include "crew/detail/mutex.hpp"
#include "crew/detail/thread_annotations.hpp"

namespace crew::detail {

// A gap this long between two looks of a spinner (normally a few
// microseconds apart) means it did not have its CPU.
inline constexpr std::int64_t kLostCpuNs = 20'000;
// A spin's window while the machine's CPUs are contended: about what a
// wake-up costs (a futex wake-up took 5 us at the median on the 2-CPU
// VM), so that a spin that fails costs no more than the wake-up it tried
// to save. Long enough for a producer that is keeping a queue filled
// (crew_bench's short_detached and factorial: without any spin while
// contended 20 to 30 % slower than with the full window), short enough
// not to wait out the gap between two requests (crewd at wrk -c8: the
// compute workers' CPU per request 4.9 us against 4.0 without a spin and
// 14 with the full 50 us).
inline constexpr std::int64_t kContendedSpinNs = 5'000;
// A spinner that sees work it cannot take this many looks in a row (about
// 4 us) yields its CPU (wake.cpp, spin_for_work).
inline constexpr unsigned kStuckLooks = 16;
// A spinner that has kept its CPU this long (tasks and spins, no sleep)
// yields it when it sees nothing queued, to a thread that may be waiting
// for that CPU behind it.
inline constexpr std::int64_t kSpinYieldNs = 200'000;
// Deferred wake-ups (wake.cpp, wake_due): a backlog shorter than kBurst tasks
// gets help once it has lasted kBacklogNs; sleepers look at the queue every
// kWatchNs while another worker is awake.
inline constexpr std::size_t kBurst = 4;
inline constexpr std::int64_t kBacklogNs = 20'000;
inline constexpr std::int64_t kWatchNs = 4'000'000;
inline constexpr int kWatchLooks = 4;
// A worker that sleeps until a coroutine timer (SuspendedTasks) wakes this
// long before it and waits out the rest on its CPU: a timed futex wait
// ends tens of microseconds late on a busy machine.
inline constexpr std::int64_t kTimerLeadNs = 30'000;

// How many workers of the process may spin at once, across all its pools,
// with `usable_cpus` CPUs: half of them, so that several pools (crewd has
// three) never spin more cores than one pool would, and the other half is
// left to the threads that submit. None with one usable CPU: every thread
// of the process shares it, so a spinner only holds it from the thread
// that would give it work (crewd on one CPU: its I/O thread answered
// refusals at p99 1.1-1.2 ms behind spinning jobs workers, 0.16-0.29 ms
// without them; docs/bench/overload.md).
constexpr int spinner_limit_for(std::size_t usable_cpus) noexcept {
  return static_cast<int>(usable_cpus / 2);
}

// The process-wide spinning slots (wake.cpp): spinner_limit_for(usable_cpus())
// workers, across all pools, spin at once. A worker takes one
// before it spins and gives it back after; a child of fork() starts with
// every slot free. Any thread.
bool take_spinner_slot() noexcept;
void give_back_spinner_slot() noexcept;
int spinner_slots_taken() noexcept;

class Cell;
class PoolCore;
struct Worker;

class WakePolicy {
 public:
  explicit WakePolicy(PoolCore& core) noexcept : core_(core) {}
  WakePolicy(const WakePolicy&) = delete;
  WakePolicy& operator=(const WakePolicy&) = delete;

  // ---- a worker, on its own thread ----
  // Polls the queues for PoolOptions::spin; true with a task popped into
  // `cell`. Always gives up the spinning token (taken here unless
  // `already_spinning`).
  bool spin_for_work(Worker& w, Cell& cell, bool already_spinning) noexcept;
  // How a worker's sleep ended: woken by a waker (`woken_spinning`: it was
  // handed a spinning token), told to look (`woken`: state or attention
  // changed), left on its own look because work was queued that no running
  // spinner would take (`saw_work`: it then looks as a spinner does, so
  // that it brings in help for what it leaves queued), or retired at its
  // idle timeout (already out of the live count).
  enum class Slept : std::uint8_t { woken, woken_spinning, saw_work, retired };
  // Sleeps on the worker's futex in the sleeper stack until one of those.
  Slept sleep_for_work(Worker& w) noexcept;
  // A worker popping without spinning, after it deferred help: looks again
  // every 8th task whether the backlog outlasted kBacklogNs.
  void wake_for_backlog(Worker& w) noexcept;
  // After a worker's pop (a no-op unless it moved a batch): the cells a batch pop moved into its
  // local queue wait there for it, or for a thief, and it is about to run a task that may be long.
  // So some worker must hold a spinning token (it steals them), or help is brought in as for a
  // spinner's backlog (wake_due: at once, or after kBacklogNs while a sleeper watches the queues).
  // Without this, a pool whose workers all ran long tasks kept such a cell queued with a worker
  // slot free (PoolWorkers.WorkersStartOnDemandUpToMax, about once in 300 to 21,000 runs under TSan
  // with other tests loading the machine). Help at once after every batch, as a submitter's push
  // brings it, doubled crew's sched p99 at 500k and 1M tasks/s: under a steady load the one spinner
  // pops a batch whenever two tasks are queued.
  void after_batch(Worker& w) noexcept;
  // Holds the worker (and the cell it popped) while the pool is paused;
  // resume() and shutdown() change the state under the worker registry's
  // mutex and notify.
  void wait_out_pause(Worker& w);

  // ---- any thread ----
  // A submitter that found no spinner running after its push.
  void wake_for_push() noexcept;
  // Wakes a sleeper, else starts a worker if every worker is busy and there
  // is room for another (submitters, and the last spinner to see work).
  void wake_or_grow() noexcept;
  // Pops the top sleeper, hands it a spinning token (and
  // IdleCounts::kWakeGraceUs to start polling), notes `waker_cpu` in it and
  // wakes it. False if nobody sleeps.
  bool wake_one(int waker_cpu) noexcept;
  // Pops and wakes every sleeper, each with a token (waker_cpu -1: not a
  // wake-up for work). Callers change what sleepers re-check (state,
  // attention) first, so that a worker going to sleep afterwards sees it.
  void wake_all() noexcept;
  // Returns once no waker is inside wake_one or wake_all, which touch a
  // popped worker until its futex wake returns: an exiting worker calls it
  // before its memory can go.
  void quiesce() noexcept;

 private:
  // Whether a worker that sees `queued` tasks (beside the one it takes)
  // brings in help now (wake.cpp says when it defers).
  bool wake_due(Worker& w, std::size_t queued) noexcept;
  // Whether queued work is left to a worker that waits for a start token
  // (PoolOptions::max_start_rate): then a sleeper that sees it stays asleep.
  [[nodiscard]] bool paced_out() const noexcept;
  // Pushes `w` (about to sleep, its own thread) on the stack, at the bottom
  // if `bottom`; counted in IdleCounts::sleepers() on return.
  void push(Worker& w, bool bottom) noexcept;
  // Takes `w` off the stack (its own thread). False if a waker popped it
  // first, and so handed it a spinning token.
  bool leave(Worker& w) noexcept;
  void pop_locked(Worker& w, int waker_cpu) noexcept CREW_REQUIRES(mu_);
  // Takes `w` off the stack's list (WakeSlot::above and below).
  void unlink_locked(Worker& w) noexcept CREW_REQUIRES(mu_);

  PoolCore& core_;
  // LIFO: the most recently idle worker is woken first, so the others can
  // reach their idle timeout; a worker that was woken onto its waker's CPU
  // goes to the bottom (WakeSlot::crowded). A list through the workers'
  // WakeSlots, so that neither a sleep nor a wake-up allocates (both are
  // noexcept, and a shutdown's wake_all must not wait on an allocation).
  // On its own line: the counts every submission reads are elsewhere
  // (IdleCounts).
  alignas(kCacheLine) Mutex mu_;
  Worker* top_ CREW_GUARDED_BY(mu_) = nullptr;
  Worker* bottom_ CREW_GUARDED_BY(mu_) = nullptr;
};

}  // namespace crew::detail

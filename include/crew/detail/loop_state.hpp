// crew/detail/loop_state.hpp: the state a parallel loop shares between its
// caller and its helper tasks, and the claim loop they all run (internal to
// crew/parallel_for.hpp).
//
// The index range is cut into `blocks` nearly equal blocks; every thread
// claims the next block with one atomic increment until none is left, and
// the thread that finishes the last block wakes the caller.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <thread>
#include <type_traits>

#include "crew/group.hpp"
#include "crew/pool.hpp"

namespace crew::detail {

// Shared by the caller of a parallel loop and its helper tasks. On the heap
// and reference counted: a helper that starts after the loop has ended (its
// worker was busy) must still be able to read it.
class LoopState {
 public:
  using RunFn = void (*)(LoopState&) noexcept;

  LoopState(std::size_t n, std::size_t block_count, RunFn run, const void* ctx, const Pool* pool,
            std::uint32_t refs) noexcept
      : refs_(refs),
        pending_(static_cast<std::uint32_t>(block_count)),
        blocks_(block_count),
        per_(n / block_count),
        extra_(n % block_count),
        run_(run),
        ctx_(ctx),
        pool_(pool) {}
  LoopState(const LoopState&) = delete;
  LoopState& operator=(const LoopState&) = delete;

  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  // A helper task's body.
  void help() noexcept {
    const RunningOn mark(pool_);
    run_(*this);
  }
  // The claim loop (run_loop) calls these.
  std::size_t claim() noexcept { return next_.fetch_add(1, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t blocks() const noexcept { return blocks_; }
  [[nodiscard]] std::size_t begin_of(std::size_t b) const noexcept {
    return b * per_ + std::min(b, extra_);
  }
  [[nodiscard]] const void* context() const noexcept { return ctx_; }
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }
  void fail(std::exception_ptr e) noexcept {
    bool expected = false;
    if (failed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      error_ = std::move(e);
    }
  }
  // A thread finished `done` blocks (it claims no more).
  void finished(std::size_t done) noexcept {
    const auto d = static_cast<std::uint32_t>(done);
    if (pending_.fetch_sub(d, std::memory_order_acq_rel) == d) pending_.notify_all();
  }
  // For the caller, after its own claim loop: blocks until every block is
  // done, then returns the first exception a body threw. What is left is at
  // most one block per helper, so it polls (yielding the core) for a while
  // before it sleeps: a futex sleep and its wake-up cost more than a short
  // block on a busy machine.
  std::exception_ptr wait_done() noexcept {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point poll_until = Clock::now() + std::chrono::microseconds(500);
    for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
      if (i % 16 == 15 && Clock::now() >= poll_until) break;
      std::this_thread::yield();
    }
    for (std::uint32_t p = pending_.load(std::memory_order_acquire); p != 0;
         p = pending_.load(std::memory_order_acquire)) {
      pending_.wait(p, std::memory_order_acquire);
    }
    return error_;
  }

 private:
  std::atomic<std::uint32_t> refs_;
  alignas(64) std::atomic<std::size_t> next_{0};    // next block to claim
  alignas(64) std::atomic<std::uint32_t> pending_;  // blocks not finished
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // written once, by whoever set failed_
  const std::size_t blocks_, per_, extra_;
  const RunFn run_;
  const void* const ctx_;  // the caller's LoopContext: read only after a claim succeeds
  const Pool* const pool_;
};

template <class I, class Body>
struct LoopContext {
  I first;
  Body* body;
};

template <class I>
I index_at(I first, std::size_t offset) noexcept {
  using U = std::make_unsigned_t<I>;
  return static_cast<I>(static_cast<U>(static_cast<U>(first) + static_cast<U>(offset)));
}

// Claims blocks until none is left and runs the body on each; the body is
// inlined into the per-index loop.
template <class I, class Body, bool kBlocks>
void run_loop(LoopState& s) noexcept {
  std::size_t done = 0;
  for (std::size_t b = s.claim(); b < s.blocks(); b = s.claim()) {
    ++done;
    if (s.failed()) continue;  // the loop is failing: finish the count only
    const auto& ctx = *static_cast<const LoopContext<I, Body>*>(s.context());
    Body& body = *ctx.body;
    const I lo = index_at(ctx.first, s.begin_of(b));
    const I hi = index_at(ctx.first, s.begin_of(b + 1));
    try {
      if constexpr (kBlocks) {
        body(lo, hi);
      } else {
        for (I i = lo; i != hi; ++i) body(i);
      }
    } catch (...) {
      s.fail(std::current_exception());
    }
  }
  if (done != 0) s.finished(done);
}
}  // namespace crew::detail

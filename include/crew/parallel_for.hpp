// crew/parallel_for.hpp: parallel loops over an index range.
//
//   parallel_for(pool, first, last, body[, opts])         body(i), i in [first, last)
//   parallel_for_blocks(pool, first, last, body[, opts])  body(begin, end) per block
//
// The index range is split into blocks. The calling thread and a few helper
// tasks on the pool (one per extra thread, not one per block) claim blocks
// one at a time with one atomic increment each, and run the body in a loop
// compiled with it (crew/detail/loop_state.hpp); the call returns when every
// block is done.
//
// Both block the calling thread until the loop is done, so the body may
// refer to the caller's objects. Called from a task of the same pool, they
// never deadlock: the caller runs loop blocks itself, and helpers that find
// no block left return at once.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <type_traits>

#include "crew/detail/loop_state.hpp"
#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"

namespace crew {

struct ParallelOptions {
  // Threads working on the loop, the caller included: 0 means one per
  // usable CPU (crew::usable_cpus()). At most the pool's max_workers + 1.
  std::size_t max_threads = 0;
  // Blocks the range is split into; 0 means 16 per thread, but none smaller
  // than `grain` indices. More blocks balance uneven bodies better; each
  // costs one atomic increment.
  std::size_t blocks = 0;
  std::size_t grain = 1;
  // The priority of the helper tasks (see PoolOptions::priority_levels).
  std::uint8_t priority = 0;
};

namespace detail {

std::size_t loop_threads(const Pool& pool, const ParallelOptions& o) noexcept;
// Throws Error(invalid_options) for a priority the pool does not have.
void check_priority(const Pool& pool, const ParallelOptions& o);
std::size_t loop_blocks(std::size_t n, std::size_t threads, const ParallelOptions& o) noexcept;

template <bool kBlocks, class I, class Body>
void parallel_loop(Pool& pool, I first, I last, Body& body, const ParallelOptions& o) {
  if (!(first < last)) return;
  check_priority(pool, o);  // before any helper exists: try_post would throw
  using U = std::make_unsigned_t<I>;
  const auto n =
      static_cast<std::size_t>(static_cast<U>(static_cast<U>(last) - static_cast<U>(first)));
  const std::size_t threads = loop_threads(pool, o);
  const std::size_t blocks = loop_blocks(n, threads, o);
  const LoopContext<I, Body> ctx{first, &body};
  const std::size_t helpers = std::min(threads, blocks) - 1;
  if (helpers == 0) {
    LoopState local(n, blocks, &run_loop<I, Body, kBlocks>, &ctx, &pool, 1);
    run_loop<I, Body, kBlocks>(local);
    if (const std::exception_ptr error = local.wait_done()) std::rethrow_exception(error);
    return;
  }
  auto* s = new LoopState(n, blocks, &run_loop<I, Body, kBlocks>, &ctx, &pool,
                          static_cast<std::uint32_t>(helpers + 1));
  // Helpers first, so that they start while the caller works; each holds a
  // reference. A refused helper (full queue, closed pool) only means one
  // thread less.
  TaskOptions helper_options;
  helper_options.priority = o.priority;
  for (std::size_t k = 0; k < helpers; ++k) {
    if (pool.try_post(
            [s]() noexcept {
              s->help();
              s->release();
            },
            helper_options) != Admission::accepted) {
      s->release();
    }
  }
  run_loop<I, Body, kBlocks>(*s);
  const std::exception_ptr error = s->wait_done();
  s->release();
  if (error) std::rethrow_exception(error);
}

template <class I1, class I2>
using loop_index_t = std::common_type_t<I1, I2>;

}  // namespace detail

template <class I>
concept loop_index = std::integral<I> && !std::same_as<std::remove_cv_t<I>, bool>;

// Calls body(i) for every i in [first, last), on the calling thread and on
// up to max_threads - 1 helper tasks of `pool`. Returns when all calls are
// done; if a body throws, blocks not started yet are skipped and the first
// exception is rethrown here. Blocks the calling thread (which works on the
// loop meanwhile), so `body` may refer to the caller's objects; it is called
// concurrently from several threads.
template <loop_index I1, loop_index I2, class Body>
  requires std::invocable<Body&, detail::loop_index_t<I1, I2>>
void parallel_for(Pool& pool, I1 first, I2 last, Body&& body, ParallelOptions opts = {}) {
  using I = detail::loop_index_t<I1, I2>;
  detail::parallel_loop<false>(pool, static_cast<I>(first), static_cast<I>(last), body, opts);
}

// As parallel_for, calling body(begin, end) once per block (BS::thread_pool's
// submit_blocks): for bodies that keep per-block state.
template <loop_index I1, loop_index I2, class Body>
  requires std::invocable<Body&, detail::loop_index_t<I1, I2>, detail::loop_index_t<I1, I2>>
void parallel_for_blocks(Pool& pool, I1 first, I2 last, Body&& body, ParallelOptions opts = {}) {
  using I = detail::loop_index_t<I1, I2>;
  detail::parallel_loop<true>(pool, static_cast<I>(first), static_cast<I>(last), body, opts);
}

}  // namespace crew

// crew/func_pool.hpp: a pool with one fixed handler (ants' PoolWithFunc).
//
// FuncPool<Arg> runs handler(arg) for every invoke(arg) on a crew::Pool of
// its own, with the pool's options, shutdown modes, observers (metrics) and
// stats:
//
//   crew::FuncPool<Request> fp({.name = "ingest", .max_workers = 8},
//                              [](Request r) { store(r); });
//   if (fp.invoke(req) != crew::Admission::accepted) { /* closed, full, ... */ }
//
// An invoke stores a pointer to the handler and the argument in the queue
// slot: no heap allocation when kInlineArg holds (Arg of at most 40 bytes,
// alignment at most 8, nothrow-movable; 32 bytes in a pool whose observers
// want task events, which time each task in the slot). The handler's type is
// kept, so the worker calls it directly.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "crew/error.hpp"
#include "crew/pool.hpp"
#include "crew/pool_types.hpp"
#include "crew/task.hpp"

namespace crew {

// Thread safety: all member functions are thread-safe. Lifetime: the
// destructor performs the pool's default shutdown (options.shutdown_mode);
// do not destroy a FuncPool from its own handler. The handler is called
// concurrently from the workers; exceptions it throws go to
// options.on_exception (or the pool's logger), like those of Pool::post.
template <class Arg>
class FuncPool {
  // What a queue slot holds for one invoke: the handler's concrete type is
  // known here, so a worker calls it directly (no std::function hop).
  template <class H>
  struct Call {
    const H* handler;
    Arg arg;
    void operator()() { (void)std::invoke(*handler, std::move(arg)); }
  };

 public:
  static_assert(std::is_move_constructible_v<Arg>, "FuncPool<Arg>: Arg must be movable");

  // Pool::post stores callables of up to 48 bytes in the queue slot.
  static constexpr std::size_t kPostInlineBytes = 48;
  static constexpr bool kInlineArg = sizeof(Call<int>) <= kPostInlineBytes &&
                                     alignof(Call<int>) <= alignof(void*) &&
                                     std::is_nothrow_move_constructible_v<Arg>;

  // `handler` is any callable taking an Arg (as const: it is shared by the
  // workers). Throws crew::Error(Errc::invalid_options) naming a bad
  // PoolOptions field, or for an empty handler (a null std::function or
  // function pointer).
  template <class H>
    requires(std::is_invocable_v<const std::decay_t<H>&, Arg&&>)
  FuncPool(PoolOptions options, H&& handler)
      : handler_(make_handler(std::forward<H>(handler))),
        post_(&post_call<std::decay_t<H>>),
        pool_(std::move(options)) {}

  // Performs the pool's default shutdown. If it had to abandon a worker,
  // the handler is kept alive (leaked) for the abandoned thread. In a child
  // of fork() for a pool created before the fork it returns at once, as
  // ~Pool does (nothing there runs the handler).
  ~FuncPool() {
    if (pool_.inherited_by_fork()) return;
    (void)pool_.shutdown();
    if (pool_.stats().abandoned != 0) (void)handler_.release();
  }

  FuncPool(const FuncPool&) = delete;
  FuncPool& operator=(const FuncPool&) = delete;
  FuncPool(FuncPool&&) = delete;
  FuncPool& operator=(FuncPool&&) = delete;

  // Queues handler(arg). Blocks while the queue is full under
  // Overflow::block (never from a worker of this pool: the call then runs
  // inline), like Pool::post.
  [[nodiscard]] Admission invoke(Arg arg) {
    return post_(pool_, handler_.get(), std::move(arg), nullptr, /*may_block=*/true);
  }
  // Never blocks.
  [[nodiscard]] Admission try_invoke(Arg arg) {
    return post_(pool_, handler_.get(), std::move(arg), nullptr, /*may_block=*/false);
  }
  // With a name or a queue timeout (one allocation: the task gets a state).
  [[nodiscard]] Admission invoke(Arg arg, TaskOptions opts) {
    return post_(pool_, handler_.get(), std::move(arg), &opts, /*may_block=*/true);
  }

  // The pool's controls, as on crew::Pool (shutdown and wait_idle throw
  // Error(Errc::would_deadlock) from a call of the handler, and in a child of
  // fork() for a pool created before the fork).
  ShutdownReport shutdown(ShutdownMode mode, std::chrono::nanoseconds timeout) {
    return pool_.shutdown(mode, timeout);
  }
  ShutdownReport shutdown() { return pool_.shutdown(); }
  bool restart() { return pool_.restart(); }
  void pause() { pool_.pause(); }
  void resume() { pool_.resume(); }
  void resize(std::size_t max_workers) { pool_.resize(max_workers); }
  bool stop_worker(std::uint64_t worker_id, WorkerStop how) {
    return pool_.stop_worker(worker_id, how);
  }
  bool wait_idle(std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max()) {
    return pool_.wait_idle(timeout);
  }

  [[nodiscard]] PoolState state() const noexcept { return pool_.state(); }
  [[nodiscard]] PoolStats stats() const { return pool_.stats(); }
  [[nodiscard]] PoolStatsHandle stats_handle() const { return pool_.stats_handle(); }
  [[nodiscard]] std::vector<WorkerInfo> workers() const { return pool_.workers(); }
  [[nodiscard]] const PoolOptions& options() const noexcept { return pool_.options(); }
  [[nodiscard]] std::string_view name() const noexcept { return pool_.name(); }

 private:
  using ErasedHandler = std::unique_ptr<void, void (*)(void*)>;
  // Builds the slot content for the handler's type; set once, so invoke()
  // costs one indirect call on the submitting side only.
  using PostFn = Admission (*)(Pool&, const void* handler, Arg&& arg, TaskOptions* opts,
                               bool may_block);

  template <class H>
  static ErasedHandler make_handler(H&& h) {
    using D = std::decay_t<H>;
    if constexpr (std::is_constructible_v<bool, const D&>) {
      if (!static_cast<bool>(h)) {
        throw Error(Errc::invalid_options, "crew::FuncPool: the handler is empty");
      }
    }
    return ErasedHandler(new D(std::forward<H>(h)), [](void* p) { delete static_cast<D*>(p); });
  }

  template <class H>
  static Admission post_call(Pool& pool, const void* handler, Arg&& arg, TaskOptions* opts,
                             bool may_block) {
    Call<H> call{static_cast<const H*>(handler), std::move(arg)};
    if (opts != nullptr) return pool.post(std::move(call), std::move(*opts));
    return may_block ? pool.post(std::move(call)) : pool.try_post(std::move(call));
  }

  // On the heap so that it can outlive the pool (see the destructor).
  ErasedHandler handler_;
  const PostFn post_;
  Pool pool_;
};

}  // namespace crew

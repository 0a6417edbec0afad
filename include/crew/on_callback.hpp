// crew/on_callback.hpp: co_await on_callback<T>(start), a coroutine task's
// wait for an operation outside crew that reports through a callback (an
// Asio async operation, a client library), and Resume<T>, the callback it
// hands that operation. Included by crew/coro.hpp, where the coroutine tasks
// themselves are.
//
// Who touches what: the awaiter lives in the waiting coroutine's frame
// (the task's thread); the Resume goes to the operation, which calls it
// from any thread; the two share a CallbackBlock, freed by whichever of
// them lets go last.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "crew/detail/coro_task.hpp"
#include "crew/error.hpp"

namespace crew {

namespace detail {
// What an on_callback wait and its Resume share: the value, and whether the
// Resume was destroyed uncalled. Holds a reference to the task, so that a
// late callback finds it (and finds it no longer armed with `gen`).
template <class T>
struct CallbackBlock {
  std::atomic<int> refs{2};  // the awaiter's and the Resume's
  CoroTaskBase* task = nullptr;
  std::uint64_t gen = 0;
  std::optional<T> value;  // empty once woken: the Resume was destroyed uncalled
  void release() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      task->drop();
      delete this;
    }
  }
};
}  // namespace detail

// The callback of an on_callback wait: call it once, from any thread, with
// the operation's result; the coroutine then resumes on its pool. Later
// calls do nothing. Destroyed uncalled, it ends the wait with
// Error(Errc::cancelled). Move-only.
template <class T>
class Resume {
 public:
  explicit Resume(detail::CallbackBlock<T>* b) noexcept : b_(b) {}
  Resume(Resume&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  Resume& operator=(Resume&&) = delete;
  Resume(const Resume&) = delete;
  Resume& operator=(const Resume&) = delete;
  ~Resume() {
    if (b_ != nullptr) end(std::exchange(b_, nullptr));
  }
  template <class V>
  void operator()(V&& v) {
    if (b_ == nullptr) return;
    detail::CallbackBlock<T>* b = std::exchange(b_, nullptr);
    b->value.emplace(std::forward<V>(v));  // before the wake: the coroutine reads it after
    end(b);
  }

 private:
  static void end(detail::CallbackBlock<T>* b) noexcept {
    (void)b->task->fire(b->gen, detail::Wake::event);  // does nothing if a stop came first
    b->release();
  }
  detail::CallbackBlock<T>* b_;
};

namespace detail {
template <class T, class Start>
struct CallbackAwaiter {
  Start start;
  CallbackBlock<T>* block = nullptr;
  CoroTaskBase* self = nullptr;
  CallbackAwaiter(Start s) : start(std::move(s)) {}  // NOLINT(google-explicit-constructor)
  CallbackAwaiter(const CallbackAwaiter&) = delete;
  CallbackAwaiter& operator=(const CallbackAwaiter&) = delete;
  ~CallbackAwaiter() {
    if (block != nullptr) block->release();  // a frame destroyed while it waited
  }
  bool await_ready() const noexcept { return false; }
  template <CrewPromise P>
  bool await_suspend(std::coroutine_handle<P> h) {
    CoroTaskBase* const t = waiting_task(h, "crew::on_callback");
    self = t;
    block = new CallbackBlock<T>();
    block->task = t;
    t->hold();
    const std::uint64_t gen = t->external_begin(h);
    if (gen == 0) {
      block->refs.store(1, std::memory_order_relaxed);  // no Resume was made
      return false;                                     // stopped: await_resume throws
    }
    block->gen = gen;
    // Once started, the operation may complete and the coroutine resume
    // elsewhere before this returns: only locals from here on.
    try {
      start(Resume<T>(block));
    } catch (...) {
      if (t->claim_own(gen)) throw;  // not suspended: the co_await throws
      return false;                  // its Resume ended the wait meanwhile: go on
    }
    return t->finish_arming(gen, /*stoppable=*/true);
  }
  T await_resume() {
    struct Release {
      CallbackBlock<T>*& b;
      ~Release() { std::exchange(b, nullptr)->release(); }
    } release{block};
    if (self->end_wait()) throw self->stop_error();
    if (!block->value) {
      throw Error(Errc::cancelled, "crew::on_callback: the callback was destroyed uncalled");
    }
    return std::move(*block->value);
  }
};
}  // namespace detail

// co_await on_callback<T>(start): waits for an operation outside crew that
// reports through a callback (an Asio async operation, a client library).
// `start(Resume<T> resume)` is called inside the co_await, on the task's
// thread, and starts the operation, which later calls resume(value) once,
// from any thread; the co_await then returns that value, on a worker of
// the task's pool. If `start` throws, so does the co_await (start's
// exception, or Error(cancelled) if the Resume was destroyed on the way
// out). A stop of the task ends the wait at once (the
// co_await throws as for a sleep) without cancelling the operation (cancel
// it yourself, from a std::stop_callback on current_stop_token()); its late
// callback then does nothing. With Asio:
//
//   auto ec = co_await crew::on_callback<boost::system::error_code>(
//       [&](auto resume) { timer.async_wait(std::move(resume)); });
template <class T, class Start>
[[nodiscard]] detail::CallbackAwaiter<T, std::decay_t<Start>> on_callback(Start&& start) {
  return detail::CallbackAwaiter<T, std::decay_t<Start>>(std::forward<Start>(start));
}

}  // namespace crew

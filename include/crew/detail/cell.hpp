// crew/detail/cell.hpp: a type-erased, move-only callable stored inline in
// 56 bytes, so that a queue slot (8-byte turn + cell) is one cache line.
// Callables up to kInlineSize bytes never allocate; larger ones are boxed,
// in a block of the calling thread's block cache (block_cache.hpp) when they
// are small enough and not over-aligned.
//
// A cell runs either a plain `void()` callable, or a callable with a member
// `run_with(void* runner)` (a long task posted without a task state, see
// pool_core.hpp's LongFn): it is given the runner passed to invoke_and_destroy,
// which supplies its stop token and watches its deadline. A `run_with` that
// returns bool says whether the runner counted the outcome (false: it ran
// as a plain callable would, and its caller counts it).
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "crew/detail/block_cache.hpp"

namespace crew::detail {

inline constexpr std::size_t kInlineSize = 48;

class TaskStateBase;

template <class F>
concept RunsWithRunner = requires(F& f, void* runner) {
  f.run_with(runner);
};

// A callable that is one step of a task rather than a task of its own (a
// coroutine task's resumption, crew/detail/coro_task.hpp) says so with
// `using step_of_task = void;`. Its run counts no outcome (invoke reports
// it counted), and the queue's sweeps ask is_step() before they count a
// dropped cell: its task counts its one outcome, whatever its steps.
template <class F>
concept TaskStep = requires {
  typename F::step_of_task;
};

// What a cell holds: a plain callable, or an owning reference to a TaskState
// (tasks with a handle, a name, a deadline or a stop token).
class Cell {
 public:
  enum class Op : unsigned char { invoke, relocate, destroy, is_step };
  // invoke: `arg` is the runner; returns true if the runner counted the
  // outcome. relocate: `arg` is the destination cell. is_step: whether
  // the callable is a TaskStep.
  using OpsFn = bool (*)(Op, Cell* self, void* arg);

  Cell() noexcept = default;
  Cell(const Cell&) = delete;
  Cell& operator=(const Cell&) = delete;

  template <class F>
  static constexpr bool fits_inline =
      sizeof(F) <= kInlineSize &&
      alignof(F) <= alignof(void*) && std::is_nothrow_move_constructible_v<F>;

  template <class F>
  static constexpr bool boxed_in_cache = sizeof(F) <= kMaxCachedBlock &&
                                         alignof(F) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__;

  // Precondition: the cell is empty.
  template <class F>
  void emplace(F&& f) {
    using D = std::decay_t<F>;
    if constexpr (fits_inline<D>) {
      ::new (static_cast<void*>(storage_)) D(std::forward<F>(f));
      ops_ = &inline_ops<D>;
    } else if constexpr (boxed_in_cache<D>) {
      void* block = cached_alloc(sizeof(D));
      D* boxed;
      try {
        boxed = ::new (block) D(std::forward<F>(f));
      } catch (...) {
        cached_free(block, sizeof(D));
        throw;
      }
      ::new (static_cast<void*>(storage_)) D*(boxed);
      ops_ = &boxed_ops<D>;
    } else {
      ::new (static_cast<void*>(storage_)) D*(new D(std::forward<F>(f)));
      ops_ = &boxed_ops<D>;
    }
  }

  // A cell that runs a TaskState; the cell owns one reference.
  void emplace_state(TaskStateBase* state) noexcept {
    std::memcpy(storage_, &state, sizeof(state));
    ops_ = nullptr;
  }

  [[nodiscard]] bool empty() const noexcept { return ops_ == nullptr && state() == nullptr; }
  [[nodiscard]] TaskStateBase* state() const noexcept {
    if (ops_ != nullptr) return nullptr;
    TaskStateBase* s;
    std::memcpy(&s, storage_, sizeof(s));
    return s;
  }

  // Moves this cell's content into `dst` (which must be empty); leaves this empty.
  void relocate_to(Cell& dst) noexcept {
    if (ops_ == nullptr) {
      std::memcpy(dst.storage_, storage_, sizeof(TaskStateBase*));
      dst.ops_ = nullptr;
    } else {
      ops_(Op::relocate, this, &dst);
    }
    clear();
  }

  // Runs a plain callable and destroys it, leaving the cell empty. The callable
  // is destroyed even when it throws. Returns true if `runner` ran it and
  // counted its outcome (a long task); exceptions of the others propagate.
  bool invoke_and_destroy(void* runner = nullptr) {
    OpsFn ops = ops_;
    struct Guard {
      Cell* c;
      OpsFn ops;
      ~Guard() {
        ops(Op::destroy, c, nullptr);
        c->clear();
      }
    } guard{this, ops};
    return ops(Op::invoke, this, runner);
  }

  // Whether the cell holds a step of a task (TaskStep), which counts
  // neither as a submission nor as an outcome of its own.
  [[nodiscard]] bool is_step() const noexcept {
    return ops_ != nullptr && ops_(Op::is_step, const_cast<Cell*>(this), nullptr);
  }

  // The callable if it is a D stored inline, else null. Only for the thread
  // that owns the cell (a queue's owner that won its slot).
  template <class D>
  [[nodiscard]] D* inline_target() noexcept {
    return ops_ == &inline_ops<D> ? std::launder(reinterpret_cast<D*>(storage_)) : nullptr;
  }

  // Destroys a plain callable without running it.
  void destroy() noexcept {
    if (ops_ != nullptr) ops_(Op::destroy, this, nullptr);
    clear();
  }

 private:
  void clear() noexcept {
    ops_ = nullptr;
    std::memset(storage_, 0, sizeof(TaskStateBase*));
  }

  template <class D>
  static bool call(D& f, void* runner) {
    if constexpr (RunsWithRunner<D>) {
      if constexpr (std::is_same_v<decltype(f.run_with(runner)), bool>) {
        return f.run_with(runner);
      } else {
        f.run_with(runner);
        return true;
      }
    } else if constexpr (TaskStep<D>) {
      (void)runner;
      f();
      return true;  // its task counts its outcome
    } else {
      (void)runner;
      f();
      return false;
    }
  }

  template <class D>
  static bool inline_ops(Op op, Cell* self, void* arg) {
    D* f = std::launder(reinterpret_cast<D*>(self->storage_));
    switch (op) {
      case Op::invoke:
        return call(*f, arg);
      case Op::relocate: {
        Cell* dst = static_cast<Cell*>(arg);
        if constexpr (std::is_trivially_copyable_v<D>) {
          std::memcpy(dst->storage_, self->storage_, sizeof(D));
        } else {
          ::new (static_cast<void*>(dst->storage_)) D(std::move(*f));
          f->~D();
        }
        dst->ops_ = self->ops_;
        break;
      }
      case Op::destroy:
        f->~D();
        break;
      case Op::is_step:
        return TaskStep<D>;
    }
    return false;
  }

  template <class D>
  static bool boxed_ops(Op op, Cell* self, void* arg) {
    D* f;
    std::memcpy(&f, self->storage_, sizeof(f));
    switch (op) {
      case Op::invoke:
        return call(*f, arg);
      case Op::relocate: {
        Cell* dst = static_cast<Cell*>(arg);
        std::memcpy(dst->storage_, self->storage_, sizeof(f));
        dst->ops_ = self->ops_;
        break;
      }
      case Op::destroy:
        if constexpr (boxed_in_cache<D>) {
          f->~D();
          cached_free(f, sizeof(D));
        } else {
          delete f;
        }
        break;
      case Op::is_step:
        return TaskStep<D>;
    }
    return false;
  }

  OpsFn ops_ = nullptr;
  alignas(void*) unsigned char storage_[kInlineSize]{};
};

static_assert(sizeof(Cell) == 56, "a queue slot (8-byte turn + cell) must be one cache line");

}  // namespace crew::detail

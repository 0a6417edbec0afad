// crew/detail/batch_tasks.hpp: how run_batch turns a range element into a
// pool task (internal to crew/batch.hpp).
//
// ElementTask runs an element that is itself a task; InputTask applies the
// batch's function to one. Both hold the element (Held) and mark the running
// thread as a task of their pool (RunningOn), so that a nested wait there
// helps the pool.
#pragma once

#include <memory>
#include <ranges>
#include <stop_token>
#include <type_traits>
#include <utility>

#include "crew/group.hpp"
#include "crew/pool.hpp"
#include "crew/task.hpp"

namespace crew::detail {

// A range element kept for a task: a pointer when the range yields lvalues
// (the range outlives the call), else the value, moved into the task.
template <class Ref>
struct Held {
  std::remove_reference_t<Ref>* p;
  explicit Held(Ref r) noexcept : p(std::addressof(r)) {}
  Ref get() noexcept { return *p; }
};
template <class Ref>
  requires(!std::is_lvalue_reference_v<Ref>)
struct Held<Ref> {
  std::remove_cvref_t<Ref> v;
  explicit Held(Ref&& r) : v(std::forward<Ref>(r)) {}
  std::remove_cvref_t<Ref>&& get() noexcept { return std::move(v); }
};

// What a task receives of an element of type Ref.
template <class Ref>
using held_arg_t = decltype(std::declval<Held<Ref>&>().get());

template <class F>
using decayed_result_t = std::decay_t<task_result_t<F>>;

// A batch task made of a range element that is itself a task.
template <class Ref>
class ElementTask {
  using C = std::remove_cvref_t<held_arg_t<Ref>>;
  using R = decayed_result_t<C>;

 public:
  ElementTask(const Pool* pool, Ref&& r) : pool_(pool), held_(std::forward<Ref>(r)) {}

  R operator()() requires(!is_long_task_v<C>) {
    const RunningOn mark(pool_);
    return static_cast<R>(std::invoke(held_.get()));
  }
  R operator()(const TaskContext& ctx) requires is_long_task_v<C> {
    const RunningOn mark(pool_);
    if constexpr (std::is_invocable_v<held_arg_t<Ref>, const TaskContext&>) {
      return static_cast<R>(std::invoke(held_.get(), ctx));
    } else {
      return static_cast<R>(std::invoke(held_.get(), ctx.stop_token));
    }
  }

 private:
  const Pool* pool_;
  Held<Ref> held_;
};

template <class Fn, class Arg>
inline constexpr bool is_long_fn_v = std::is_invocable_v<Fn&, Arg, const TaskContext&> ||
                                     std::is_invocable_v<Fn&, Arg, std::stop_token>;

template <class Fn, class Arg>
struct FnResult {
  using type = std::invoke_result_t<Fn&, Arg>;
};
template <class Fn, class Arg>
  requires std::is_invocable_v<Fn&, Arg, const TaskContext&>
struct FnResult<Fn, Arg> {
  using type = std::invoke_result_t<Fn&, Arg, const TaskContext&>;
};
template <class Fn, class Arg>
  requires(!std::is_invocable_v<Fn&, Arg, const TaskContext&> &&
           std::is_invocable_v<Fn&, Arg, std::stop_token>)
struct FnResult<Fn, Arg> {
  using type = std::invoke_result_t<Fn&, Arg, std::stop_token>;
};

// A batch task that applies the batch's function to one input.
template <class Fn, class Ref>
class InputTask {
  using Arg = held_arg_t<Ref>;
  using R = std::decay_t<typename FnResult<Fn, Arg>::type>;

 public:
  InputTask(const Pool* pool, Fn* fn, Ref&& r)
      : pool_(pool), fn_(fn), held_(std::forward<Ref>(r)) {}

  R operator()() requires(!is_long_fn_v<Fn, Arg>) {
    const RunningOn mark(pool_);
    return static_cast<R>(std::invoke(*fn_, held_.get()));
  }
  R operator()(const TaskContext& ctx) requires is_long_fn_v<Fn, Arg> {
    const RunningOn mark(pool_);
    if constexpr (std::is_invocable_v<Fn&, Arg, const TaskContext&>) {
      return static_cast<R>(std::invoke(*fn_, held_.get(), ctx));
    } else {
      return static_cast<R>(std::invoke(*fn_, held_.get(), ctx.stop_token));
    }
  }

 private:
  const Pool* pool_;
  Fn* fn_;
  Held<Ref> held_;
};
template <class Range>
using element_result_t =
    decayed_result_t<std::remove_cvref_t<held_arg_t<std::ranges::range_reference_t<Range>>>>;

template <class Range, class Fn>
using input_result_t =
    std::decay_t<typename FnResult<Fn, held_arg_t<std::ranges::range_reference_t<Range>>>::type>;

}  // namespace crew::detail

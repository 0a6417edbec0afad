// Group, the facade (include/crew/group.hpp) over its GroupState
// (group_state.hpp): the handles of a group's tasks, waiting,
// cancellation, counting; and GroupState's own out-of-line parts (its
// allocation from a per-thread cache, its handle blocks), in this file so
// that a group's construction and destruction, once per fork in recursion
// through groups, inline them.
#include "crew/group.hpp"

#include <chrono>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "crew/log.hpp"
#include "group_state.hpp"

namespace crew {
namespace detail {
namespace {

// A few freed group states per thread, for the next group made on it: in
// recursion through groups (a group per node) states are made and freed on
// the same threads at the rate of tasks. Off under AddressSanitizer, so that
// a state used after it was freed is still caught.
class StateCache {
 public:
  static constexpr int kKeep = kBlockCacheOn ? 8 : 0;
  StateCache() = default;
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;
  ~StateCache() {
    closed = true;
    while (n_ > 0) ::operator delete(free_[--n_]);
  }
  void* take() noexcept { return n_ > 0 ? free_[--n_] : nullptr; }
  bool keep(void* p) noexcept {
    if (n_ == kKeep) return false;
    free_[n_++] = p;
    return true;
  }
  // Set once the thread's cache is gone (states freed later by the
  // thread's other exit-time destructors go straight to the heap); a
  // separate trivially destructible flag, readable until the thread ends.
  static inline thread_local bool closed = false;

 private:
  void* free_[kKeep > 0 ? kKeep : 1] = {};
  int n_ = 0;
};
thread_local StateCache t_state_cache;

}  // namespace

Block* new_block(std::uint64_t cap) {
  void* mem = ::operator new(sizeof(Block) + cap * sizeof(Task<void>));
  auto* slots = reinterpret_cast<Task<void>*>(static_cast<char*>(mem) + sizeof(Block));
  for (std::uint64_t i = 0; i < cap; ++i) ::new (static_cast<void*>(slots + i)) Task<void>();
  return ::new (mem) Block{cap, nullptr, slots};
}

void delete_block(Block* b) noexcept {
  for (std::uint64_t i = 0; i < b->cap; ++i) b->slots[i].~Task<void>();
  b->~Block();
  ::operator delete(static_cast<void*>(b));
}

Clock::time_point deadline_after(std::chrono::nanoseconds timeout) {
  if (timeout.count() == 0) return Clock::time_point::max();
  return saturating_deadline(Clock::now(), timeout);
}

GroupOptions&& validated(GroupOptions&& o) {
  if (o.timeout.count() < 0) [[unlikely]] {
    throw Error(Errc::invalid_options, "crew::GroupOptions.timeout: must not be negative");
  }
  return std::move(o);
}

Admission admission_of(Task<void>& task) {
  if (task.status() != TaskStatus::rejected || task.reason() != Errc::rejected) {
    return Admission::accepted;
  }
  try {
    task.get();
  } catch (const Error& e) {
    return e.admission();
  } catch (...) {
  }
  return Admission::closed;
}

void* GroupState::operator new(std::size_t size) {
  if (!StateCache::closed) {
    if (void* p = t_state_cache.take()) return p;
  }
  return ::operator new(size);
}

void GroupState::operator delete(void* p) noexcept {
  if (StateCache::closed || !t_state_cache.keep(p)) ::operator delete(p);
}

bool await_returned(const Pool& pool, const TaskStateBase* s, std::string_view who,
                    std::string_view name,
                    std::chrono::steady_clock::time_point deadline) noexcept {
  if (s == nullptr || !s->callable_live()) return true;
  const std::shared_ptr<Logger>& logger = pool.options().logger;
  if (logger && LogLevel::warning >= logger->level()) {
    try {
      std::string message(who);
      if (!name.empty()) message.append(" ").append(name);
      message += " waits for a written-off task whose callable still runs";
      logger->log(LogLevel::warning,
                  {.pool = pool.name(),
                   .task = s->name(),
                   .task_id = s->id,
                   .correlation_id = s->correlation_id()},
                  message);
    } catch (...) {  // out of memory while formatting: drop the line
    }
  }
  return s->wait_returned_until(deadline);
}

namespace {
GroupState* state_of(GroupHead* g) noexcept { return static_cast<GroupState*>(g); }
}  // namespace

void group_retain(GroupHead* g) noexcept { state_of(g)->retain(); }
void group_release(GroupHead* g) noexcept { state_of(g)->release(); }
void group_task_failed(GroupHead* g, std::exception_ptr e) noexcept {
  state_of(g)->failed(std::move(e));
}
Admission group_prepare(GroupHead* g, TaskOptions& opts, bool is_long) {
  return state_of(g)->prepare(opts, is_long);
}
Admission group_adopt(GroupHead* g, Task<void>&& task) {
  return state_of(g)->adopt(std::move(task));
}
void group_counted_begin(GroupHead* g) noexcept { state_of(g)->counted_begin(); }
void group_counted_end(GroupHead* g, TaskStatus outcome) noexcept {
  state_of(g)->counted_end(outcome);
}

}  // namespace detail

Group::Group(Pool& pool, GroupOptions options)
    : pool_(&pool), state_(new detail::GroupState(pool, std::move(options))) {}

Group::~Group() {
  detail::GroupState* s = detail::state_of(state_);
  if (!s->quiet() && !s->settled()) {
    const detail::NoStackThrowScope no_throw;  // a destructor: nest rather than throw
    s->cancel();
    (void)s->wait_until(std::chrono::steady_clock::time_point::max());
    s->close();
  }
  s->release();
}

void Group::wait() { (void)wait_until(std::chrono::steady_clock::time_point::max()); }
bool Group::wait_until(std::chrono::steady_clock::time_point deadline) {
  detail::GroupState* s = detail::state_of(state_);
  const bool ended = s->wait_until(deadline);
  // Where a wait cannot throw (~Group, unwinding), the group's queued tasks
  // were cancelled for want of stack and the wait returns.
  if (s->take_stack_cancel() && detail::waits_may_throw_for_stack()) {
    throw Error(Errc::stack_exhausted,
                detail::stack_exhausted_message(s->describe() + ": its queued tasks"));
  }
  return ended;
}
void Group::cancel() { detail::state_of(state_)->cancel(); }
GroupStats Group::stats() const { return detail::state_of(state_)->stats(); }
bool Group::cancelled() const noexcept { return state_->cancelled(); }
std::exception_ptr Group::first_exception() const {
  return detail::state_of(state_)->first_exception();
}
void Group::rethrow_if_failed() const {
  const detail::GroupState* st = detail::state_of(state_);
  if (std::exception_ptr e = st->first_exception()) std::rethrow_exception(e);
  // Work that never ran is a failed result too: a fork-join whose subtask a
  // draining pool refused (nested submissions included) would otherwise
  // return a partial answer without a word.
  const GroupStats s = st->stats();
  if (s.outcomes.rejected != 0) {
    throw Error(Errc::rejected, st->describe() + ": " + std::to_string(s.outcomes.rejected) +
                                    " of its tasks did not run (refused at submission, dropped "
                                    "by a shutdown, or expired in the queue)");
  }
}
std::optional<std::chrono::steady_clock::time_point> Group::deadline() const noexcept {
  const auto d = detail::state_of(state_)->deadline();
  if (d == std::chrono::steady_clock::time_point::max()) return std::nullopt;
  return d;
}

}  // namespace crew

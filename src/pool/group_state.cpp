// GroupState's helpers and its allocation (src/pool/group_state.hpp).
#include "group_state.hpp"

#include <new>

namespace crew::detail {
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

GroupOptions validated(GroupOptions o) {
  if (o.timeout.count() < 0) {
    throw Error(Errc::invalid_options, "crew::GroupOptions.timeout: must not be negative");
  }
  return o;
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

}  // namespace crew::detail

// The timer heap's operations (timer_heap.hpp).
#include "timer_heap.hpp"

#include <utility>

#include "crew/detail/assert.hpp"

namespace crew::detail {
namespace {

using Entry = TimerHeap::Entry;
using Heap = std::vector<Entry>;

void place(Heap& h, std::size_t i, Entry e) noexcept {
  h[i] = e;
  e.state->extras()->heap_index = i;
}

void sift_up(Heap& h, std::size_t i) noexcept {
  const Entry e = h[i];
  while (i > 0) {
    const std::size_t parent = (i - 1) / 2;
    if (h[parent].at_ns <= e.at_ns) break;
    place(h, i, h[parent]);
    i = parent;
  }
  place(h, i, e);
}

// Returns where the entry ended.
std::size_t sift_down(Heap& h, std::size_t i) noexcept {
  const Entry e = h[i];
  const std::size_t n = h.size();
  for (;;) {
    std::size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && h[child + 1].at_ns < h[child].at_ns) ++child;
    if (e.at_ns <= h[child].at_ns) break;
    place(h, i, h[child]);
    i = child;
  }
  place(h, i, e);
  return i;
}

// Removes h[i]; O(log n).
void erase_at(Heap& h, std::size_t i) noexcept {
  TaskStateBase* removed = h[i].state;
  const Entry last = h.back();
  h.pop_back();
  removed->extras()->heap_index = TaskStateBase::kNotInHeap;
  if (i < h.size()) {
    place(h, i, last);
    sift_up(h, sift_down(h, i));
  }
}

}  // namespace

bool TimerHeap::push(TaskStateBase* s, std::int64_t at_ns, bool exec) {
  CREW_ASSERT(s->extras() != nullptr, "a timer on a task without Extras");
  SpinLockGuard lock(mu_);
  heap_.push_back({at_ns, s});  // may throw: nothing armed yet
  s->timer_exec = exec;
  sift_up(heap_, heap_.size() - 1);
  return s->extras()->heap_index == 0;
}

bool TimerHeap::erase(TaskStateBase* s) noexcept {
  SpinLockGuard lock(mu_);
  TaskStateBase::Extras* x = s->extras();
  if (x == nullptr || x->heap_index == TaskStateBase::kNotInHeap) return false;
  erase_at(heap_, x->heap_index);
  return true;
}

std::int64_t TimerHeap::pop_due(std::int64_t now, std::vector<TaskStateBase*>& due) {
  SpinLockGuard lock(mu_);
  while (!heap_.empty() && heap_.front().at_ns <= now) {
    due.push_back(heap_.front().state);  // may throw: the front stays armed
    erase_at(heap_, 0);
  }
  return heap_.empty() ? kNever : heap_.front().at_ns;
}

std::vector<TimerHeap::Entry> TimerHeap::take_all() noexcept {
  Heap armed;
  SpinLockGuard lock(mu_);
  armed.swap(heap_);
  for (const Entry& e : armed) e.state->extras()->heap_index = TaskStateBase::kNotInHeap;
  return armed;
}

}  // namespace crew::detail

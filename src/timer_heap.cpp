// The timer heap's operations (timer_heap.hpp).
#include "timer_heap.hpp"

#include <utility>

#include "crew/detail/assert.hpp"

namespace crew::detail {
namespace {

using Heap = std::vector<TaskStateBase*>;

bool earlier(const TaskStateBase* a, const TaskStateBase* b) noexcept {
  return a->extras()->timer_at_ns < b->extras()->timer_at_ns;
}

void place(Heap& h, std::size_t i, TaskStateBase* s) noexcept {
  h[i] = s;
  s->extras()->heap_index = i;
}

void sift_up(Heap& h, std::size_t i) noexcept {
  TaskStateBase* s = h[i];
  while (i > 0) {
    const std::size_t parent = (i - 1) / 2;
    if (!earlier(s, h[parent])) break;
    place(h, i, h[parent]);
    i = parent;
  }
  place(h, i, s);
}

void sift_down(Heap& h, std::size_t i) noexcept {
  TaskStateBase* s = h[i];
  const std::size_t n = h.size();
  for (;;) {
    std::size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && earlier(h[child + 1], h[child])) ++child;
    if (!earlier(h[child], s)) break;
    place(h, i, h[child]);
    i = child;
  }
  place(h, i, s);
}

// Removes h[i]; O(log n).
void erase_at(Heap& h, std::size_t i) noexcept {
  TaskStateBase* removed = h[i];
  TaskStateBase* last = h.back();
  h.pop_back();
  removed->extras()->heap_index = TaskStateBase::kNotInHeap;
  if (i < h.size()) {
    place(h, i, last);
    sift_down(h, i);
    sift_up(h, last->extras()->heap_index);
  }
}

}  // namespace

bool TimerHeap::push(TaskStateBase* s, std::int64_t at_ns, bool exec) {
  CREW_ASSERT(s->extras() != nullptr, "a timer on a task without Extras");
  MutexLock lock(mu_);
  heap_.push_back(s);  // may throw: nothing armed yet
  s->extras()->timer_at_ns = at_ns;
  s->timer_exec = exec;
  sift_up(heap_, heap_.size() - 1);
  return s->extras()->heap_index == 0;
}

bool TimerHeap::erase(TaskStateBase* s) noexcept {
  MutexLock lock(mu_);
  TaskStateBase::Extras* x = s->extras();
  if (x == nullptr || x->heap_index == TaskStateBase::kNotInHeap) return false;
  erase_at(heap_, x->heap_index);
  return true;
}

std::int64_t TimerHeap::pop_due(std::int64_t now, std::vector<TaskStateBase*>& due) {
  MutexLock lock(mu_);
  while (!heap_.empty() && heap_.front()->extras()->timer_at_ns <= now) {
    due.push_back(heap_.front());  // may throw: the front stays armed
    erase_at(heap_, 0);
  }
  return heap_.empty() ? kNever : heap_.front()->extras()->timer_at_ns;
}

std::vector<TaskStateBase*> TimerHeap::take_all() noexcept {
  Heap armed;
  MutexLock lock(mu_);
  armed.swap(heap_);
  for (TaskStateBase* s : armed) s->extras()->heap_index = TaskStateBase::kNotInHeap;
  return armed;
}

}  // namespace crew::detail

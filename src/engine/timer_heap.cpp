// The timer heap's operations (timer_heap.hpp).
#include "timer_heap.hpp"

#include <algorithm>
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

void TimerHeap::lane_unwrap() noexcept {
  std::rotate(lane_.begin(), lane_.begin() + static_cast<std::ptrdiff_t>(lane_head_), lane_.end());
  lane_head_ = 0;
}

void TimerHeap::lane_push(Entry e) {
  if (lane_count_ == lane_.size()) {
    lane_unwrap();
    lane_.resize(lane_.empty() ? 64 : 2 * lane_.size());  // may throw, leaving the ring as it was
  }
  lane_at(lane_count_) = e;
  e.state->extras()->heap_index = kInLane | (lane_front_seq_ + lane_count_);
  ++lane_count_;
}

void TimerHeap::lane_pop_front() noexcept {
  for (;;) {
    lane_head_ = (lane_head_ + 1) & (lane_.size() - 1);
    ++lane_front_seq_;
    --lane_count_;
    if (lane_count_ == 0 || lane_at(0).state != nullptr) return;
    --lane_cleared_;  // the new front was cleared: drop it too
  }
}

void TimerHeap::lane_compact() noexcept {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < lane_count_; ++i) {
    const Entry e = lane_at(i);
    if (e.state == nullptr) continue;
    lane_at(kept) = e;
    e.state->extras()->heap_index = kInLane | (lane_front_seq_ + kept);
    ++kept;
  }
  lane_count_ = kept;
  lane_cleared_ = 0;
}

bool TimerHeap::push(TaskStateBase* s, std::int64_t at_ns, bool exec) {
  CREW_ASSERT(s->extras() != nullptr, "a timer on a task without Extras");
  SpinLockGuard lock(mu_);
  // Ties stay below the entry armed first, in either place.
  const bool lane_empty = lane_count_ == 0;
  if (lane_empty || lane_at(lane_count_ - 1).at_ns <= at_ns) {
    lane_push({at_ns, s});  // may throw: nothing armed yet
    s->timer_exec = exec;
    return lane_empty && (heap_.empty() || at_ns < heap_.front().at_ns);
  }
  heap_.push_back({at_ns, s});  // may throw: nothing armed yet
  s->timer_exec = exec;
  sift_up(heap_, heap_.size() - 1);
  // The lane is not empty here, and its front is live.
  return s->extras()->heap_index == 0 && at_ns < lane_at(0).at_ns;
}

bool TimerHeap::erase(TaskStateBase* s) noexcept {
  SpinLockGuard lock(mu_);
  TaskStateBase::Extras* x = s->extras();
  if (x == nullptr || x->heap_index == TaskStateBase::kNotInHeap) return false;
  const std::size_t where = x->heap_index;
  if ((where & kInLane) == 0) {
    erase_at(heap_, where);
    return true;
  }
  x->heap_index = TaskStateBase::kNotInHeap;
  const std::size_t i = (where & ~kInLane) - lane_front_seq_;
  CREW_ASSERT(i < lane_count_ && lane_at(i).state == s, "a lane entry out of place");
  if (i == 0) {
    lane_pop_front();
    return true;
  }
  lane_at(i).state = nullptr;
  ++lane_cleared_;
  if (lane_cleared_ > lane_slack_ && lane_cleared_ > lane_count_ - lane_cleared_) lane_compact();
  return true;
}

std::int64_t TimerHeap::pop_due(std::int64_t now, std::vector<Due>& due) {
  SpinLockGuard lock(mu_);
  for (;;) {
    const bool from_lane =
        lane_count_ != 0 && (heap_.empty() || lane_at(0).at_ns <= heap_.front().at_ns);
    if (from_lane) {
      Entry& front = lane_at(0);
      if (front.at_ns > now) break;
      due.push_back({front.state, front.state->timer_exec});  // may throw: the front stays armed
      front.state->extras()->heap_index = TaskStateBase::kNotInHeap;
      lane_pop_front();
    } else {
      if (heap_.empty() || heap_.front().at_ns > now) break;
      due.push_back(
          {heap_.front().state, heap_.front().state->timer_exec});  // may throw: stays armed
      erase_at(heap_, 0);
    }
  }
  std::int64_t next = heap_.empty() ? kNever : heap_.front().at_ns;
  if (lane_count_ != 0) next = std::min(next, lane_at(0).at_ns);
  return next;
}

TimerHeap::Armed TimerHeap::take_all() noexcept {
  Armed armed;
  SpinLockGuard lock(mu_);
  armed.heap.swap(heap_);
  // The ring cut to its entries, the cleared ones left out (no allocation).
  lane_unwrap();
  lane_.resize(lane_count_);
  std::erase_if(lane_, [](const Entry& e) { return e.state == nullptr; });
  armed.lane.swap(lane_);
  lane_count_ = lane_cleared_ = 0;
  for (const auto* part : {&armed.heap, &armed.lane}) {
    for (const Entry& e : *part) e.state->extras()->heap_index = TaskStateBase::kNotInHeap;
  }
  return armed;
}

}  // namespace crew::detail

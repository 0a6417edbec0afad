// tests/support/peak.hpp: a high-water mark that several threads raise (the
// most tasks running at once, the deepest level or stack a run reached).
#pragma once

#include <atomic>

namespace crew::test {

// Raises `peak` to `value` if `value` is higher. std::atomic has no
// fetch_max before C++26: a compare-exchange loop that stops once `peak`
// holds `value` or more.
template <class T>
void raise_peak(std::atomic<T>& peak, T value,
                std::memory_order order = std::memory_order_seq_cst) noexcept {
  T seen = peak.load(std::memory_order_relaxed);  // the exchange reads it again
  while (value > seen && !peak.compare_exchange_weak(seen, value, order)) {
  }
}

}  // namespace crew::test

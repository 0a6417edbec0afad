// bench/loop_data.hpp: the array the parallel_for workload writes, shared by
// crew's and oneTBB's implementations so that both run the same body on the
// same memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "harness.hpp"

namespace bench {

// n uint32 elements, written once at construction so that the timed loop
// does not pay the page faults. The body under test stores p[i] = i.
class LoopArray {
 public:
  explicit LoopArray(std::size_t n) : v_(n, 0xffff'ffffu) {}
  [[nodiscard]] std::uint32_t* data() noexcept { return v_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return v_.size(); }
  // Every index was visited.
  void check() const {
    for (std::size_t i = 0; i < v_.size(); ++i) {
      if (v_[i] != static_cast<std::uint32_t>(i)) fail("parallel_for: an index was not visited");
    }
  }

 private:
  std::vector<std::uint32_t> v_;
};

}  // namespace bench

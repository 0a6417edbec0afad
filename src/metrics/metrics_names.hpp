// The task-name label table of one pool's metrics (src/metrics/metrics_series.hpp
// owns one per pool): task name -> slot of the pool's counter blocks.
//
// Slot 0 is task="unnamed", slot 1 task="other", then one per distinct
// label value, at most max_names of them. An insert-only open addressing
// table with at least twice the slots it will ever hold, whose entries are
// published with release stores: lookups take no lock, and once the table
// is full a new name goes to "other" without one either. A name's label is
// the name with bytes that are not well-formed UTF-8 replaced by U+FFFD, so
// names that differ only there share a slot.
//
// Threads: slot_of() runs on any pool thread that reports a task (the hot
// path: lock-free for a name seen before); a new name takes mu_ once.
// labels() runs on scrapes, under mu_. The table is never shrunk, so an
// entry a lookup finds stays valid as long as the table.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "crew/detail/mutex.hpp"

namespace crew::detail::prom {

// `s` with every byte that is not part of well-formed UTF-8 replaced by
// U+FFFD: label values must be UTF-8, and a task name is arbitrary bytes.
[[nodiscard]] std::string utf8_label(std::string_view s);

class NameTable {
 public:
  static constexpr std::uint32_t kUnnamed = 0;
  static constexpr std::uint32_t kOther = 1;

  explicit NameTable(std::size_t max_names);
  NameTable(const NameTable&) = delete;
  NameTable& operator=(const NameTable&) = delete;

  [[nodiscard]] std::size_t slots() const noexcept { return max_names_ + 2; }

  // Hot path. Out of memory on a new name counts it under "other".
  std::uint32_t slot_of(std::string_view name) noexcept {
    return name.empty() ? kUnnamed : named_slot(name);
  }

  // The label value of each slot in use, by slot.
  [[nodiscard]] std::vector<std::string> labels() const;

 private:
  struct Entry {
    std::string name;
    std::size_t hash;
    std::uint32_t slot;
  };

  [[gnu::noinline]] std::uint32_t named_slot(std::string_view name) noexcept;
  const Entry* find(std::string_view name, std::size_t h) const noexcept;
  std::uint32_t add(std::string_view name, std::size_t h);
  void insert_locked(std::unique_ptr<Entry> e) CREW_REQUIRES(mu_);

  const std::size_t max_names_;
  const std::size_t capacity_;  // a power of two > 2 x the entries it will hold
  const std::unique_ptr<std::atomic<const Entry*>[]> table_;
  std::atomic<bool> full_{false};
  mutable Mutex mu_;
  std::size_t names_ CREW_GUARDED_BY(mu_) = 0;  // entries besides the two reserved
  std::vector<std::unique_ptr<Entry>> entries_ CREW_GUARDED_BY(mu_);  // owns table_'s entries
  std::vector<std::string> labels_ CREW_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::uint32_t> by_label_ CREW_GUARDED_BY(mu_);
};

}  // namespace crew::detail::prom

// The task-name label table (src/metrics/metrics_names.hpp).
#include "metrics_names.hpp"

#include <algorithm>
#include <bit>
#include <functional>
#include <utility>

namespace crew::detail::prom {
namespace {

std::size_t hash(std::string_view s) noexcept { return std::hash<std::string_view>{}(s); }

}  // namespace

std::string utf8_label(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    std::size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // at most U+10FFFF
    }
    bool ok = len != 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      const unsigned char b = p[i + k];
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

NameTable::NameTable(std::size_t max_names)
    : max_names_(max_names),
      capacity_(std::bit_ceil(std::max<std::size_t>(8, 2 * (max_names + 2)))),
      table_(new std::atomic<const Entry*>[capacity_]()) {
  MutexLock lock(mu_);
  labels_ = {"unnamed", "other"};
  by_label_.emplace("unnamed", kUnnamed);
  by_label_.emplace("other", kOther);
  insert_locked(std::make_unique<Entry>(Entry{"unnamed", hash("unnamed"), kUnnamed}));
  insert_locked(std::make_unique<Entry>(Entry{"other", hash("other"), kOther}));
  full_.store(max_names_ == 0, std::memory_order_relaxed);
}

std::vector<std::string> NameTable::labels() const {
  MutexLock lock(mu_);
  return labels_;
}

std::uint32_t NameTable::named_slot(std::string_view name) noexcept {
  const std::size_t h = hash(name);
  if (const Entry* e = find(name, h)) return e->slot;
  if (full_.load(std::memory_order_acquire)) return kOther;
  try {
    return add(name, h);
  } catch (...) {
    return kOther;
  }
}

const NameTable::Entry* NameTable::find(std::string_view name, std::size_t h) const noexcept {
  for (std::size_t i = h & (capacity_ - 1);; i = (i + 1) & (capacity_ - 1)) {
    const Entry* e = table_[i].load(std::memory_order_acquire);
    if (e == nullptr) return nullptr;
    if (e->hash == h && e->name == name) return e;
  }
}

std::uint32_t NameTable::add(std::string_view name, std::size_t h) {
  MutexLock lock(mu_);
  if (const Entry* e = find(name, h)) return e->slot;  // added meanwhile
  if (names_ >= max_names_) return kOther;
  // Names that differ only in bytes that are not UTF-8 share a label.
  std::string label = utf8_label(name);
  auto [it, fresh] = by_label_.try_emplace(label, static_cast<std::uint32_t>(labels_.size()));
  if (fresh) labels_.push_back(std::move(label));
  const std::uint32_t slot = it->second;
  insert_locked(std::make_unique<Entry>(Entry{std::string(name), h, slot}));
  if (++names_ == max_names_) full_.store(true, std::memory_order_release);
  return slot;
}

void NameTable::insert_locked(std::unique_ptr<Entry> e) {
  std::size_t i = e->hash & (capacity_ - 1);
  while (table_[i].load(std::memory_order_relaxed) != nullptr) i = (i + 1) & (capacity_ - 1);
  entries_.push_back(std::move(e));
  table_[i].store(entries_.back().get(), std::memory_order_release);
}

}  // namespace crew::detail::prom

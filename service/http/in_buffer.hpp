// service/http/in_buffer.hpp: a connection's received bytes not yet parsed
// (service/http/connection.hpp). Owned by one connection and touched only by
// its I/O thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

namespace crewd::http {

// What a connection has received and not yet parsed. Allocated while
// needed; an idle connection holds none (released by the sweep).
class InBuffer {
 public:
  [[nodiscard]] std::string_view data() const noexcept {
    return {buf_.get() + begin_, end_ - begin_};
  }
  [[nodiscard]] bool empty() const noexcept { return begin_ == end_; }
  [[nodiscard]] std::size_t size() const noexcept { return end_ - begin_; }
  void consume(std::size_t n) noexcept {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
  }
  void clear() noexcept { begin_ = end_ = 0; }
  // Room for up to `want` more bytes with at most `cap` held in all; empty
  // when `cap` is reached.
  std::span<char> prepare(std::size_t want, std::size_t cap) {
    const std::size_t have = size();
    if (have >= cap) return {};
    want = std::min(want, cap - have);
    if (cap_ - end_ < want) {
      if (cap_ - have >= want) {
        std::memmove(buf_.get(), buf_.get() + begin_, have);
      } else {
        const std::size_t size = std::min(std::max(have + want, cap_ * 2), cap);
        auto fresh = std::make_unique_for_overwrite<char[]>(size);
        if (have > 0) std::memcpy(fresh.get(), buf_.get() + begin_, have);
        buf_ = std::move(fresh);
        cap_ = size;
      }
      begin_ = 0;
      end_ = have;
    }
    return {buf_.get() + end_, want};
  }
  void commit(std::size_t n) noexcept { end_ += n; }
  void release() noexcept {
    if (empty()) {
      buf_.reset();
      cap_ = begin_ = end_ = 0;
    }
  }

 private:
  std::unique_ptr<char[]> buf_;
  std::size_t cap_ = 0;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
};

}  // namespace crewd::http

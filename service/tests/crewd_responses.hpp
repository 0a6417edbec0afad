// service/tests/crewd_responses.hpp: reading crewd's responses off one
// connection for the front-door tests: successive responses (pipelining,
// interim responses) with what follows each, whether the peer closed, and
// the JSON error of a response. Every read is bounded.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "crewd_harness.hpp"

namespace crewd::test {

// Reads successive responses from one connection (pipelining, interim
// responses), keeping what follows each one.
class Responses {
 public:
  explicit Responses(int fd) : fd_(fd) {}

  // The next response, or one whose outcome says why there is none.
  Exchange next(std::chrono::milliseconds bound = 5'000ms, bool head_request = false) {
    Exchange ex;
    read_response(fd_, raw_, ex, Clock::now() + bound * kSlowdown, head_request);
    if (ex.outcome == Exchange::Outcome::response) {
      const auto end = raw_.find("\r\n\r\n") + 4;
      raw_.erase(0, end + (head_request ? 0 : ex.body.size()));
    }
    return ex;
  }

  // Whether the peer closed (EOF or reset) within `bound`, with nothing
  // more to read.
  bool closed(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound * kSlowdown;
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
      if (n > 0) raw_.append(buf, static_cast<std::size_t>(n));
    }
    return false;
  }

  [[nodiscard]] const std::string& pending() const { return raw_; }

 private:
  int fd_;
  std::string raw_;
};

inline bool send_all(int fd, std::string_view data) {
  int err = 0;
  return write_all(fd, data, err);
}

inline nlohmann::json json_of(const Exchange& ex) {
  return nlohmann::json::parse(ex.body, nullptr, false);
}

inline std::string error_of(const Exchange& ex) {
  const nlohmann::json j = json_of(ex);
  return j.is_object() ? j.value("error", std::string()) : std::string();
}

}  // namespace crewd::test

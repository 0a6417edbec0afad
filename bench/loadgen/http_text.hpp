// bench/loadgen/http_text.hpp (private): the HTTP text loadgen reads:
// a response's head (status, Connection: close, the length of head and
// body), the "reason" of a JSON error body, and the target URL
// (parse_url, declared in loadgen.hpp). No state; the generator's thread.
#pragma once

#include <cstddef>
#include <string_view>

namespace loadgen {

// A parsed response head, or how much more is needed.
struct Head {
  bool complete = false;  // the whole response (head and body) is in the buffer
  bool bad = false;
  int status = 0;
  bool close = false;
  std::size_t length = 0;  // head + body
  std::size_t body_at = 0;
};

// The head at the start of `in` (a response being received).
Head parse_head(std::string_view in);
// The "reason" field of a JSON error body, if it has one.
std::string_view body_reason(std::string_view body);

}  // namespace loadgen

// service/http/request.hpp: crewd's HTTP/1.1 request layer, without I/O.
//
// RequestParser turns client bytes into one request (Boost.Beast's parser
// underneath, with crewd's limits: header section size and field count,
// body size, strict Content-Length and Transfer-Encoding), or into the
// status and message of the error response. match_path matches a path
// against a route pattern (the route table is in routes.hpp); Response and
// append_response write a response. The connection layer (connection.cpp)
// feeds bytes in and writes bytes out; the libFuzzer target
// (service/fuzz/request_fuzzer.cpp) feeds raw bytes through the same code.
//
// Nothing here echoes client input beyond short printable pieces, and
// nothing throws for bad input (std::bad_alloc aside).
#pragma once

#include <boost/beast/http/basic_parser.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace crewd {

// Bounds of one request (docs/crewd.md, "Limits").
struct HttpLimits {
  std::size_t header_bytes = 16 * 1024;  // request line and header fields; more: 431 (414)
  std::size_t header_count = 100;        // header fields; more: 431
  std::size_t body_bytes = 64 * 1024;    // decoded body; more: 413
};

// A request whose head (and, once complete, body) has been read.
struct Request {
  std::string method;                      // as sent (a token)
  std::string target;                      // as sent
  std::string_view path() const noexcept;  // target without query, origin form
  int version = 11;                        // 10 or 11
  bool keep_alive = true;                  // HTTP/1.1 default, Connection: close, 1.0 keep-alive
  bool expect_continue = false;            // Expect: 100-continue
  bool expect_other = false;               // another expectation: 417
  bool has_body = false;                   // Content-Length > 0 or chunked
  std::size_t fields = 0;
  // The fields the console's routes check (service/ui/console_guard.hpp);
  // the last one sent of each, empty without.
  std::string authorization;   // Authorization
  std::string sec_fetch_site;  // Sec-Fetch-Site
  // X-Request-Id, the last one sent; the connection makes one for a
  // request without it (make_request_id). The tasks of the request carry it
  // (crew::TaskOptions::correlation_id) and the response returns it.
  std::string request_id;
  // X-Priority and X-Deadline-Ms, the last one sent of each (nullopt:
  // none); the job route reads them from the head (jobs.hpp, JobHeaders).
  std::optional<std::string> priority;
  std::optional<std::string> deadline_ms;
  // When the head was complete (set by the connection): what a deadline
  // relative to the request counts from.
  std::chrono::steady_clock::time_point head_at{};
  std::string body;
};

// A request that cannot be read: what to answer. The connection is closed
// after the answer (the rest of the stream cannot be trusted).
struct RequestError {
  int status = 400;
  std::string message;
};

// One request at a time: construct, feed() until done() or failed(), take
// request(); a new parser for the next request on the connection.
class RequestParser final : public boost::beast::http::basic_parser<true> {
 public:
  explicit RequestParser(const HttpLimits& limits);

  // Parses from the start of `data`, which holds everything received and not
  // yet consumed; returns how many bytes were consumed (the caller drops
  // them). Fewer than all and not done: call again once more has arrived,
  // with the unconsumed bytes first. Stops after the head, so that the
  // caller can look at it (header_done()) before the body is read.
  std::size_t feed(std::string_view data);

  [[nodiscard]] bool header_done() const noexcept { return is_header_done(); }
  [[nodiscard]] bool done() const noexcept { return is_done(); }
  [[nodiscard]] bool failed() const noexcept { return failed_; }
  [[nodiscard]] const RequestError& error() const noexcept { return error_; }
  [[nodiscard]] Request& request() noexcept { return request_; }
  // Declared body length, when there is a Content-Length (after the head).
  [[nodiscard]] std::uint64_t declared_length() const noexcept { return declared_; }

 private:
  void on_request_impl(boost::beast::http::verb, boost::beast::string_view method,
                       boost::beast::string_view target, int version,
                       boost::beast::error_code& ec) override;
  void on_response_impl(int, boost::beast::string_view, int, boost::beast::error_code& ec) override;
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, boost::beast::error_code& ec) override;
  void on_header_impl(boost::beast::error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& length,
                         boost::beast::error_code& ec) override;
  std::size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                            boost::beast::error_code& ec) override;
  std::size_t on_chunk_body_impl(std::uint64_t remain, boost::beast::string_view body,
                                 boost::beast::error_code& ec) override;
  void on_finish_impl(boost::beast::error_code& ec) override;

  void fail(const boost::beast::error_code& ec);

  HttpLimits limits_;
  Request request_;
  RequestError error_;
  std::uint64_t declared_ = 0;
  bool failed_ = false;
  bool line_done_ = false;
  // Empty lines dropped before the request line (feed()).
  static constexpr int kLeadingEmptyLines = 4;
  int skipped_lines_ = 0;
  bool started_ = false;  // a byte other than a leading empty line arrived
  // Why a parse error was raised from a callback (beast only carries the code).
  enum class Why : std::uint8_t { none, too_many_fields, bad_coding, unknown_coding, bad_host };
  Why why_ = Why::none;
  int hosts_ = 0;  // Host fields seen
  bool transfer_encoding_ = false;
  bool chunked_last_ = false;
  bool chunked_seen_ = false;
};

// Whether `path` matches `pattern`: literal text, and at most one "{name}"
// that matches one non-empty path segment. Returns that segment (empty
// without one), or nullopt. The route table (routes.hpp) matches with it.
[[nodiscard]] std::optional<std::string_view> match_path(std::string_view pattern,
                                                         std::string_view path) noexcept;
// Whether `method` is one of `methods`, a list as in an Allow header ("GET, HEAD").
[[nodiscard]] bool method_listed(std::string_view methods, std::string_view method) noexcept;

// An X-Request-Id crewd takes: 1..kMaxRequestId visible ASCII characters
// (0x21-0x7e), so that it shows as it is in logs and the console. Another
// is answered 400.
inline constexpr std::size_t kMaxRequestId = 64;  // crew::kMaxCorrelationId
[[nodiscard]] bool valid_request_id(std::string_view id) noexcept;
// A new id, unique in the process and unlikely to repeat across instances:
// 8 hex digits drawn at start, '-', a counter in hex ("1f3a9c0e-2a").
// Thread-safe.
[[nodiscard]] std::string make_request_id();

// A response, written by append_response.
struct Response {
  int status = 200;
  std::string body;
  std::string_view content_type = "application/json";
  std::string_view allow;  // 405: the Allow header
  // 503 of a full or overloaded pool: Retry-After in seconds (0: none).
  int retry_after = 0;
  bool close = false;       // Connection: close
  bool keep_alive = false;  // Connection: keep-alive (for an HTTP/1.0 client that asked)
  // More header lines, each "Name: value\r\n" (the console's security headers).
  std::string headers;
};

// {"error": message, "status": status}
[[nodiscard]] Response error_response(int status, std::string_view message);
[[nodiscard]] std::string_view reason_phrase(int status) noexcept;
// Status line, headers, blank line, then the body unless `head_only`.
void append_response(std::string& out, const Response& r, bool head_only);

}  // namespace crewd

#include "http/request.hpp"

#include <algorithm>
#include <atomic>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <charconv>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

namespace crewd {
namespace {

namespace http = boost::beast::http;
using boost::beast::error_code;
using boost::beast::iequals;

// Beast's codes to the status crewd answers with, and a short message
// (never the client's bytes).
RequestError error_of(const error_code& ec, bool line_done, const HttpLimits& limits) {
  if (ec == http::error::header_limit) {
    if (!line_done) {
      return {414, "request line longer than http.header_limit (" +
                       std::to_string(limits.header_bytes) + " bytes)"};
    }
    return {431, "header section larger than http.header_limit (" +
                     std::to_string(limits.header_bytes) + " bytes)"};
  }
  if (ec == http::error::body_limit) {
    return {413, "request body larger than http.body_limit (" + std::to_string(limits.body_bytes) +
                     " bytes)"};
  }
  if (ec == http::error::bad_content_length) {
    return {400, "malformed request: invalid or conflicting Content-Length"};
  }
  if (ec == http::error::bad_transfer_encoding) {
    return {400, "malformed request: invalid Transfer-Encoding (or with Content-Length)"};
  }
  if (ec == http::error::bad_version) return {400, "malformed request: bad HTTP version"};
  if (ec == http::error::bad_method) return {400, "malformed request: bad method"};
  if (ec == http::error::bad_target) return {400, "malformed request: bad request target"};
  if (ec == http::error::bad_field || ec == http::error::bad_value ||
      ec == http::error::bad_obs_fold) {
    return {400, "malformed request: bad header field"};
  }
  if (ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension) {
    return {400, "malformed request: bad chunked encoding"};
  }
  if (ec == http::error::bad_line_ending) return {400, "malformed request: bad line ending"};
  return {400, "malformed request"};
}

}  // namespace

std::string_view Request::path() const noexcept {
  std::string_view t = target;
  // absolute-form (a proxy's): drop scheme and authority.
  if (t.starts_with("http://") || t.starts_with("https://")) {
    const auto authority = t.find("//") + 2;
    const auto slash = t.find('/', authority);
    t = slash == std::string_view::npos ? std::string_view("/") : t.substr(slash);
  }
  return t.substr(0, t.find('?'));
}

RequestParser::RequestParser(const HttpLimits& limits) : limits_(limits) {
  header_limit(static_cast<std::uint32_t>(
      std::min<std::size_t>(limits.header_bytes, std::numeric_limits<std::uint32_t>::max())));
  body_limit(static_cast<std::uint64_t>(limits.body_bytes));
  eager(false);  // stop after the head
}

std::size_t RequestParser::feed(std::string_view data) {
  if (failed_ || is_done()) return 0;
  std::size_t consumed = 0;
  // RFC 9112 section 2.2: a server SHOULD ignore at least one empty line
  // (CRLF) before the request line (some clients send one after a POST
  // body). Up to kLeadingEmptyLines are dropped; more reach the parser,
  // which answers 400.
  while (!started_ && skipped_lines_ < kLeadingEmptyLines && consumed < data.size() &&
         data[consumed] == '\r') {
    if (consumed + 1 == data.size()) return consumed;  // its LF has not arrived yet
    if (data[consumed + 1] != '\n') break;
    consumed += 2;
    ++skipped_lines_;
  }
  if (consumed == data.size()) return consumed;
  started_ = true;
  while (!is_done() && consumed < data.size()) {
    error_code ec;
    const std::size_t n =
        put(boost::asio::const_buffer(data.data() + consumed, data.size() - consumed), ec);
    consumed += n;
    if (ec == http::error::need_more) break;
    if (ec) {
      fail(ec);
      break;
    }
    // The head is done: return, so that the caller decides about the body.
    // Then parse the body greedily.
    if (is_header_done() && !eager()) {
      eager(true);
      break;
    }
    if (n == 0) break;
  }
  return consumed;
}

void RequestParser::fail(const error_code& ec) {
  failed_ = true;
  switch (why_) {
    case Why::too_many_fields:
      error_ = {431, "more than http.header_count_limit (" + std::to_string(limits_.header_count) +
                         ") header fields"};
      return;
    case Why::bad_coding:
      error_ = {400, "malformed request: chunked must be the last transfer coding, and once"};
      return;
    case Why::unknown_coding:
      error_ = {501, "only the chunked transfer coding is supported"};
      return;
    case Why::bad_host:
      error_ = {400,
                "malformed request: an HTTP/1.1 request has exactly one Host header field, "
                "an HTTP/1.0 request at most one"};
      return;
    case Why::none:
      break;
  }
  error_ = error_of(ec, line_done_, limits_);
}

void RequestParser::on_request_impl(http::verb, boost::beast::string_view method,
                                    boost::beast::string_view target, int version, error_code&) {
  line_done_ = true;
  request_.method.assign(method.data(), method.size());
  request_.target.assign(target.data(), target.size());
  request_.version = version;
}

void RequestParser::on_response_impl(int, boost::beast::string_view, int, error_code& ec) {
  ec = http::error::bad_version;  // never called for a request parser
}

void RequestParser::on_field_impl(http::field name, boost::beast::string_view name_string,
                                  boost::beast::string_view value, error_code& ec) {
  if (++request_.fields > limits_.header_count) {
    why_ = Why::too_many_fields;
    ec = http::error::header_limit;
    return;
  }
  if (name == http::field::host) {
    ++hosts_;
  } else if (name == http::field::authorization) {
    request_.authorization.assign(value.data(), value.size());
  } else if (name == http::field::unknown && iequals(name_string, "Sec-Fetch-Site")) {
    request_.sec_fetch_site.assign(value.data(), value.size());
  } else if (name == http::field::unknown && iequals(name_string, "X-Request-Id")) {
    request_.request_id.assign(value.data(), value.size());
  } else if (name == http::field::unknown && iequals(name_string, "X-Priority")) {
    request_.priority.emplace(value.data(), value.size());
  } else if (name == http::field::unknown && iequals(name_string, "X-Deadline-Ms")) {
    request_.deadline_ms.emplace(value.data(), value.size());
  } else if (name == http::field::expect) {
    if (iequals(value, "100-continue")) {
      request_.expect_continue = true;
    } else {
      request_.expect_other = true;
    }
  } else if (name == http::field::transfer_encoding) {
    // Beast marks the body chunked only when chunked is the last coding;
    // anything else is refused in on_header_impl.
    transfer_encoding_ = true;
    // Across fields too: chunked in an earlier Transfer-Encoding field
    // counts (chunked_seen_).
    bool other = false;
    bool twice = false;
    for (const auto& coding : http::token_list(value)) {
      if (iequals(coding, "chunked")) {
        if (chunked_seen_) twice = true;
        chunked_seen_ = true;
        chunked_last_ = true;
      } else {
        other = true;
        chunked_last_ = false;
      }
    }
    if (twice || (chunked_seen_ && !chunked_last_)) {
      why_ = Why::bad_coding;  // chunked twice, or not last: malformed (400)
      ec = http::error::bad_transfer_encoding;
    } else if (other) {
      why_ = Why::unknown_coding;  // a coding crewd does not do (501)
      ec = http::error::bad_transfer_encoding;
    }
  }
}

void RequestParser::on_header_impl(error_code& ec) {
  // RFC 9112, section 3.2: a server answers 400 to an HTTP/1.1 request
  // without a Host field and to any request with more than one.
  if (hosts_ > 1 || (hosts_ == 0 && request_.version >= 11)) {
    why_ = Why::bad_host;
    ec = http::error::bad_field;
    return;
  }
  if (transfer_encoding_ && !chunked_last_) {
    why_ = Why::bad_coding;
    ec = http::error::bad_transfer_encoding;
    return;
  }
  request_.keep_alive = keep_alive();
  const auto length = content_length();
  declared_ = length ? *length : 0;
  request_.has_body = chunked() || (length && *length > 0);
}

void RequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& length, error_code&) {
  if (length) request_.body.reserve(static_cast<std::size_t>(*length));  // <= body_limit
}

std::size_t RequestParser::on_body_impl(boost::beast::string_view body, error_code&) {
  request_.body.append(body.data(), body.size());
  return body.size();
}

void RequestParser::on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) {}

std::size_t RequestParser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                              error_code&) {
  request_.body.append(body.data(), body.size());
  return body.size();
}

void RequestParser::on_finish_impl(error_code&) {}

std::optional<std::string_view> match_path(std::string_view pattern,
                                           std::string_view path) noexcept {
  std::string_view arg;
  if (const auto open = pattern.find('{'); open != std::string_view::npos) {
    const auto close = pattern.find('}', open);
    if (close == std::string_view::npos || !path.starts_with(pattern.substr(0, open))) {
      return std::nullopt;
    }
    arg = path.substr(open);
    arg = arg.substr(0, arg.find('/'));
    if (arg.empty()) return std::nullopt;
    pattern.remove_prefix(close + 1);
    path.remove_prefix(open + arg.size());
  }
  if (path != pattern) return std::nullopt;
  return arg;
}

bool method_listed(std::string_view methods, std::string_view method) noexcept {
  while (!methods.empty()) {
    const auto comma = methods.find(',');
    if (methods.substr(0, comma) == method) return true;
    if (comma == std::string_view::npos) break;
    methods.remove_prefix(comma + 1);
    while (methods.starts_with(' ')) methods.remove_prefix(1);
  }
  return false;
}

Response error_response(int status, std::string_view message) {
  using Json = nlohmann::ordered_json;
  Response r;
  r.status = status;
  r.body = Json{{"error", std::string(message)}, {"status", status}}.dump(
      -1, ' ', false, Json::error_handler_t::replace);
  return r;
}

std::string_view reason_phrase(int status) noexcept {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

bool valid_request_id(std::string_view id) noexcept {
  return !id.empty() && id.size() <= kMaxRequestId &&
         std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

std::string make_request_id() {
  static const std::uint32_t prefix = std::random_device{}();
  static std::atomic<std::uint64_t> next{0};
  char buf[32];
  const int n = std::snprintf(buf, sizeof(buf), "%08x-%llx", static_cast<unsigned>(prefix),
                              static_cast<unsigned long long>(next.fetch_add(1) + 1));
  return std::string(buf, static_cast<std::size_t>(n));
}

void append_response(std::string& out, const Response& r, bool head_only) {
  char num[24];
  out += "HTTP/1.1 ";
  out.append(num, std::to_chars(num, num + sizeof(num), r.status).ptr);
  out += ' ';
  out += reason_phrase(r.status);
  out += "\r\nContent-Type: ";
  out += r.content_type;
  out += "\r\nContent-Length: ";
  out.append(num, std::to_chars(num, num + sizeof(num), r.body.size()).ptr);
  if (!r.allow.empty()) {
    out += "\r\nAllow: ";
    out += r.allow;
  }
  if (r.retry_after > 0) {
    out += "\r\nRetry-After: ";
    out.append(num, std::to_chars(num, num + sizeof(num), r.retry_after).ptr);
  }
  if (r.close) {
    out += "\r\nConnection: close";
  } else if (r.keep_alive) {
    out += "\r\nConnection: keep-alive";
  }
  out += "\r\n";
  out += r.headers;
  out += "\r\n";
  if (!head_only) out += r.body;
}

}  // namespace crewd

// The console's page and its headers (service/ui/console_page.hpp).
#include "ui/console_page.hpp"

#include <array>
#include <cstdint>
#include <random>

namespace crewd::ui {

std::string console_page(std::string_view nonce) {
  constexpr std::string_view kMark = "__NONCE__";
  const std::string_view html = console_html();
  std::string out;
  out.reserve(html.size() + 64);
  std::size_t at = 0;
  for (;;) {
    const std::size_t next = html.find(kMark, at);
    out.append(html.substr(at, next - at));
    if (next == std::string_view::npos) break;
    out.append(nonce);
    at = next + kMark.size();
  }
  return out;
}

std::string make_nonce() {
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  thread_local std::random_device device;  // the kernel's generator (getrandom)
  std::array<std::uint8_t, 18> bytes{};    // 144 bits: 24 characters, no padding
  for (std::size_t i = 0; i < bytes.size(); i += 2) {
    const auto v = device();
    bytes[i] = static_cast<std::uint8_t>(v);
    bytes[i + 1] = static_cast<std::uint8_t>(v >> 8);
  }
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::uint32_t v =
        (std::uint32_t{bytes[i]} << 16) | (std::uint32_t{bytes[i + 1]} << 8) | bytes[i + 2];
    for (int k = 3; k >= 0; --k) out += kB64[(v >> (6 * k)) & 63];
  }
  return out;
}

std::string page_headers(std::string_view nonce) {
  std::string n(nonce);
  return "Content-Security-Policy: default-src 'none'; script-src 'nonce-" + n +
         "'; style-src 'nonce-" + n +
         "'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
         "frame-ancestors 'none'\r\n"
         "X-Content-Type-Options: nosniff\r\n"
         "X-Frame-Options: DENY\r\n"
         "Referrer-Policy: no-referrer\r\n"
         "Cache-Control: no-store\r\n";
}

std::string_view api_headers() noexcept {
  return "X-Content-Type-Options: nosniff\r\n"
         "Cache-Control: no-store\r\n";
}

}  // namespace crewd::ui

// service/ui/console_page.hpp: the console's page, service/ui/console.html,
// compiled into crewd (CMake reads the file into a generated source), and
// the headers it is served with.
#pragma once

#include <string>
#include <string_view>

namespace crewd::ui {

// console.html as it is in the source tree.
[[nodiscard]] std::string_view console_html() noexcept;

// The page with `nonce` in place of each "__NONCE__" (its <style> and
// <script> tags carry it).
[[nodiscard]] std::string console_page(std::string_view nonce);

// A fresh nonce for one response: 128 random bits, base64.
[[nodiscard]] std::string make_nonce();

// The response header lines ("Name: value\r\n") of the page: a strict
// Content-Security-Policy allowing only its own nonce'd style and script
// and requests to its own origin, and no framing, sniffing or referrer.
[[nodiscard]] std::string page_headers(std::string_view nonce);
// Those of the snapshot and the actions.
[[nodiscard]] std::string_view api_headers() noexcept;

}  // namespace crewd::ui

// The console's access rules (service/ui/console_guard.hpp).
#include "ui/console_guard.hpp"

#include <cstddef>
#include <string_view>

namespace crewd::ui {
namespace {

// Compares in time that depends on the lengths only, not on where the
// bytes differ.
bool same_secret(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

bool bearer_matches(std::string_view field, std::string_view token) noexcept {
  constexpr std::string_view kScheme = "Bearer ";
  if (field.size() < kScheme.size()) return false;
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    const char c = field[i];
    const char lower = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    const char want = kScheme[i];
    const char want_lower =
        (want >= 'A' && want <= 'Z') ? static_cast<char>(want - 'A' + 'a') : want;
    if (lower != want_lower) return false;
  }
  field.remove_prefix(kScheme.size());
  return same_secret(field, token);
}

}  // namespace

bool served_on(const Config::Ui& ui, const boost::asio::ip::address& local) {
  boost::asio::ip::address a = local;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    a = boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  }
  if (a.is_loopback()) return true;
  if (ui.admin_address.empty()) return false;
  boost::system::error_code ec;
  const auto admin = boost::asio::ip::make_address(ui.admin_address, ec);
  return !ec && (admin == a || admin == local);
}

std::optional<Response> refusal(const Config::Ui& ui, const boost::asio::ip::address& local,
                                const Request& request, Access access) {
  if (!ui.enabled) return error_response(404, "no such route");
  if (!served_on(ui, local)) {
    return error_response(403, "the console answers on loopback and ui.admin_address only");
  }
  if (access == Access::page) return std::nullopt;
  if (!ui.token.empty() && !bearer_matches(request.authorization, ui.token)) {
    return error_response(401, "the console needs Authorization: Bearer <ui.token>");
  }
  if (access == Access::read) return std::nullopt;
  if (ui.read_only) return error_response(403, "the console is read-only (ui.read_only)");
  if (request.sec_fetch_site != "same-origin") {
    return error_response(403, "actions need Sec-Fetch-Site: same-origin (the console's own page)");
  }
  return std::nullopt;
}

}  // namespace crewd::ui

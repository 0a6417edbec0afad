// service/ui/console_guard.hpp: who may use the console (docs/crewd.md,
// "Console"). Pure functions over the settings of [ui], the connection's
// local address and the request's header fields, so that each rule is
// tested alone (crewd_ui_test).
//
//   - ui.enabled false: every console route answers 404, as if it did not
//     exist.
//   - Only connections made to a loopback address, or to ui.admin_address,
//     are served (403 otherwise): a crewd listening on 0.0.0.0 for its
//     API does not show its console to the network.
//   - ui.token set: the snapshot and the actions need
//     "Authorization: Bearer <token>" (401 otherwise). The page itself
//     holds no data and needs none.
//   - Actions (POST): refused (403) in ui.read_only, and unless the browser
//     says the request comes from the console's own origin
//     (Sec-Fetch-Site: same-origin), so that another site cannot make a
//     visitor's browser cancel jobs.
//
// No escaping happens on the server: the page puts every field into the
// DOM as text (textContent), never as markup, and the JSON encoder escapes
// what JSON needs.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <optional>
#include <string>

#include "config/config.hpp"
#include "http/request.hpp"

namespace crewd::ui {

enum class Access : std::uint8_t {
  page,   // GET /ui: no data
  read,   // the snapshot
  write,  // an action
};

// Whether the console answers on a connection whose local address is
// `local`: loopback (IPv4, IPv6, IPv4-mapped) or ui.admin_address.
[[nodiscard]] bool served_on(const Config::Ui& ui, const boost::asio::ip::address& local);

// The refusal of a console request, or nothing if it may go on.
[[nodiscard]] std::optional<Response> refusal(const Config::Ui& ui,
                                              const boost::asio::ip::address& local,
                                              const Request& request, Access access);

}  // namespace crewd::ui

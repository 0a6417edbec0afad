// service/config/config_validate.hpp: what crewd's setting values must be: the
// checks the settings table (settings.hpp) applies to single values, and
// the checks load_config applies once every source has been read: settings
// that are fine alone but not together, and the listen host resolving.
//
// Pure functions of their arguments (resolve_error asks the resolver);
// called on main's thread during start-up.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.hpp"

namespace crewd {

// Decimal digits only, fitting uint64.
[[nodiscard]] std::optional<std::uint64_t> parse_uint(std::string_view text);

// Each returns what the value must be, or nothing if it is fine.
[[nodiscard]] std::optional<std::string> check_redis_name(std::string_view v);
[[nodiscard]] std::optional<std::string> check_consumer(std::string_view v);
[[nodiscard]] std::optional<std::string> check_anything(std::string_view v);
[[nodiscard]] std::optional<std::string> check_redis_address(std::string_view v);
// jobs.call_url: empty, or an http:// URL (parse_http_url).
[[nodiscard]] std::optional<std::string> check_call_url(std::string_view v);
// ui.admin_address: a numeric IPv4 or IPv6 address, or empty.
[[nodiscard]] std::optional<std::string> check_ui_address(std::string_view v);
// ui.token: empty, or 16..256 characters of a bearer token (RFC 6750 b64token).
[[nodiscard]] std::optional<std::string> check_ui_token(std::string_view v);

// Parses and stores the listen setting (host and port of `c`), or says
// what it must be.
[[nodiscard]] std::optional<std::string> set_listen(Config& c, std::string_view text);

// Settings that are fine alone but not together: the first conflict.
[[nodiscard]] std::optional<std::string> cross_check(const Config& c);

// Resolves the listen host as the server will (passive, TCP): an empty
// string, or the resolver's reason. Blocks on the resolver (getaddrinfo).
[[nodiscard]] std::string resolve_error(const std::string& host);

}  // namespace crewd

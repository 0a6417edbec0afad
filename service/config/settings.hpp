// service/config/settings.hpp: the table of crewd's settings: for each one its
// key, its help line, the range or names it accepts, how it is read from
// text (environment, flags) and from TOML, and how it is shown (--help,
// --print-config). Also the settings that were removed, so that naming one
// says what replaced it. config.hpp describes how the sources are layered;
// config_sources.hpp reads them; config_validate.hpp holds the value checks
// the table uses and the checks across settings.
//
// Threads: the table is built on first use (a function-local static) and
// only read after that; load_config runs once, on main's thread, before
// crewd starts any other.
#pragma once

#include <toml++/toml.h>

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"

namespace crewd {

// One setting: its key, its help line, and how to read and show its value.
// The readers return an error message (what the value must be), or nothing.
struct Setting {
  std::string key;
  std::string help;
  std::function<std::optional<std::string>(Config&, std::string_view)> from_text;
  std::function<std::optional<std::string>(Config&, const toml::node&)> from_toml;
  std::function<std::string(const Config&)> show;  // as a TOML value
};

// Every setting, in the order --help and --print-config list them.
[[nodiscard]] const std::vector<Setting>& settings();

// Settings that existed and went: a file, variable or flag naming one gets
// `why` instead of "unknown setting".
struct Removed {
  std::string_view key;
  std::string_view why;
};
[[nodiscard]] std::span<const Removed> removed_settings();
[[nodiscard]] const Removed* removed_setting(std::string_view key);

// The listen setting as written: HOST:PORT, or [IPV6]:PORT.
[[nodiscard]] std::string listen_text(const Config& c);

}  // namespace crewd

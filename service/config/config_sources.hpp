// service/config/config_sources.hpp: the three places crewd's settings come from,
// read in the order config.hpp gives (each overriding the one before): a
// TOML file, the CREWD_* environment, command-line flags. Each reader
// applies what it finds to a Config and records, per setting, where its
// value came from (--print-config shows it); the first bad value stops it
// with the message start-up prints.
//
// Threads: all of it runs once, on main's thread, before crewd starts any
// other; nothing here is shared.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"

namespace crewd {

enum class Source : std::uint8_t { defaults, file, env, flag };

// How an origin reads in --print-config: "default", "file F", "env", "flag".
[[nodiscard]] std::string source_name(Source s, const std::string& file);

// Where each setting's value came from, by its index in settings().
using Origins = std::vector<std::string>;

// Client-controlled text in an error message: printable, short, quoted.
[[nodiscard]] std::string shown_value(std::string_view text);

// "crewd: configuration error: KEY = VALUE (FROM): MUST\n".
[[nodiscard]] std::string error_line(const std::string& key, const std::string& value,
                                     const std::string& from, const std::string& must);

// 1. The TOML file at `path`: every key must be a known setting. Returns the
// error message, or nothing once every value is applied.
[[nodiscard]] std::optional<std::string> read_config_file(const std::string& path, Config& config,
                                                          Origins& origins);

// 2. The environment: every CREWD_* variable must name a setting (or be
// CREWD_CONFIG, or a Kubernetes service link). Returns the error message,
// or nothing once every value is applied.
[[nodiscard]] std::optional<std::string> read_environment(const Environment& env, Config& config,
                                                          Origins& origins);

// 3. The command line: --config, --print-config, --help and one flag per
// setting (and, hidden, per removed setting).
class CommandLine {
 public:
  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // Why start-up ends at parsing: --help (exit 0, text for stdout) or a
  // usage error (kUsageExit, text for stderr).
  struct Stop {
    int exit_code = 0;
    std::string out;
    std::string err;
  };
  [[nodiscard]] std::optional<Stop> parse(const std::vector<std::string>& args);

  [[nodiscard]] const std::string& config_file() const noexcept { return config_file_; }
  [[nodiscard]] bool print_config() const noexcept { return print_config_; }

  // Applies the flags given, after the file and the environment. Returns
  // the error message for the first bad one, or nothing.
  [[nodiscard]] std::optional<std::string> apply(Config& config, Origins& origins) const;

 private:
  CLI::App cli_;
  std::string config_file_;
  bool print_config_ = false;
  std::vector<std::string> values_;          // by setting
  std::vector<CLI::Option*> options_;        // by setting
  std::vector<std::string> removed_values_;  // by removed setting
  std::vector<CLI::Option*> removed_options_;
};

}  // namespace crewd

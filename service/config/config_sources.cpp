// The three sources of crewd's settings (service/config/config_sources.hpp), and
// the names a setting goes by in them (env_name, flag_name, config.hpp).
#include "config/config_sources.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <utility>

#include "config/settings.hpp"

namespace crewd {
namespace {

// A TOML value as it was written (strings quoted), short and printable.
std::string shown_node(const toml::node& node) {
  if (node.is_table()) return "(a table)";
  if (node.is_array()) return "(an array)";
  if (const auto str = node.value_exact<std::string>()) return shown_value(*str);
  std::ostringstream os;
  node.visit([&os](const auto& v) { os << v; });
  const std::string quoted = shown_value(os.str());
  return quoted.substr(1, quoted.size() - 2);  // not a string: no quotes
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean X?)" for the closest of `names`, if it is close.
std::string suggestion(std::string_view name, const std::vector<std::string>& names) {
  std::size_t best = 4;
  std::string found;
  for (const auto& n : names) {
    const std::size_t d = edit_distance(name, n);
    if (d < best) {
      best = d;
      found = n;
    }
  }
  return found.empty() ? "" : " (did you mean " + found + "?)";
}

// Kubernetes' service links for a Service named crewd: CREWD_SERVICE_HOST,
// CREWD_SERVICE_PORT[_NAME], CREWD_PORT, CREWD_PORT_<port>_<proto>[_PROTO|_PORT|_ADDR].
bool kubernetes_service_link(std::string_view name) {
  name.remove_prefix(std::string_view("CREWD_").size());
  if (name == "SERVICE_HOST" || name == "SERVICE_PORT" || name.starts_with("SERVICE_PORT_") ||
      name == "PORT") {
    return true;
  }
  if (!name.starts_with("PORT_")) return false;
  name.remove_prefix(5);
  const auto digits = name.find_first_not_of("0123456789");
  if (digits == 0 || digits == std::string_view::npos) return false;
  name.remove_prefix(digits);
  for (const std::string_view proto : {"_TCP", "_UDP", "_SCTP"}) {
    if (name.starts_with(proto)) {
      const std::string_view rest = name.substr(proto.size());
      return rest.empty() || rest == "_PROTO" || rest == "_PORT" || rest == "_ADDR";
    }
  }
  return false;
}

}  // namespace

std::string source_name(Source s, const std::string& file) {
  switch (s) {
    case Source::defaults:
      return "default";
    case Source::file:
      return "file " + file;
    case Source::env:
      return "env";
    case Source::flag:
      return "flag";
  }
  return "?";
}

std::string shown_value(std::string_view text) {
  std::string out;
  for (const char ch : text.substr(0, 64)) {
    out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  }
  if (text.size() > 64) out += "...";
  return "\"" + out + "\"";
}

std::string error_line(const std::string& key, const std::string& value, const std::string& from,
                       const std::string& must) {
  return "crewd: configuration error: " + key + " = " + value + " (" + from + "): " + must + "\n";
}

Environment process_environment() {
  // Read once, at start-up, before crewd starts any thread.
  Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with("CREWD_")) continue;
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

std::string env_name(std::string_view key) {
  std::string out = "CREWD_";
  for (const char c : key) {
    out += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string flag_name(std::string_view key) {
  std::string out = "--";
  for (const char c : key) out += (c == '.' || c == '_') ? '-' : c;
  return out;
}

std::optional<std::string> read_config_file(const std::string& path, Config& config,
                                            Origins& origins) {
  const auto& all = settings();
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return "crewd: configuration error: cannot read " + path + " (" + where.str() +
           "): " + std::string(e.description()) + "\n";
  }
  // Every key must be a known setting: a typo must not pass silently.
  std::string problem;
  const auto visit = [&](const std::string& key, const toml::node& node) {
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const Setting& s) { return s.key == key; });
    const std::string line = std::to_string(node.source().begin.line);
    if (it == all.end()) {
      if (const Removed* r = removed_setting(key)) {
        problem = "crewd: configuration error: " + key + " in " + path + " (line " + line +
                  "): " + std::string(r->why) + "\n";
        return;
      }
      std::vector<std::string> keys;
      for (const Setting& st : all) keys.push_back(st.key);
      problem = "crewd: configuration error: unknown setting " + key + " in " + path + " (line " +
                line + ")" + suggestion(key, keys) + "\n";
      return;
    }
    if (auto err = it->from_toml(config, node)) {
      problem = error_line(key, shown_node(node), "from file " + path + ", line " + line, *err);
      return;
    }
    origins[static_cast<std::size_t>(it - all.begin())] = source_name(Source::file, path);
  };
  for (const auto& [k, node] : doc) {
    const std::string key(k.str());
    if (const auto* section = node.as_table()) {
      for (const auto& [sub, value] : *section) {
        if (problem.empty()) visit(key + "." + std::string(sub.str()), value);
      }
    } else if (problem.empty()) {
      visit(key, node);
    }
  }
  if (!problem.empty()) return problem;
  return std::nullopt;
}

std::optional<std::string> read_environment(const Environment& env, Config& config,
                                            Origins& origins) {
  const auto& all = settings();
  std::vector<std::string> env_names{"CREWD_CONFIG"};
  for (const Setting& st : all) env_names.push_back(env_name(st.key));
  for (const auto& [name, value] : env) {
    if (!name.starts_with("CREWD_") ||
        std::find(env_names.begin(), env_names.end(), name) != env_names.end() ||
        kubernetes_service_link(name)) {
      continue;
    }
    for (const Removed& r : removed_settings()) {
      if (env_name(r.key) == name) {
        return "crewd: configuration error: " + name + "=" + shown_value(value) +
               " (env): " + std::string(r.key) + " " + std::string(r.why) + "\n";
      }
    }
    return "crewd: configuration error: unknown environment variable " + name + "=" +
           shown_value(value) + ": no such setting" + suggestion(name, env_names) +
           " (crewd --help lists them)\n";
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Setting& s = all[i];
    const std::string name = env_name(s.key);
    if (const auto it = env.find(name); it != env.end()) {
      if (auto err = s.from_text(config, it->second)) {
        return error_line(s.key, shown_value(it->second), "from env " + name, *err);
      }
      origins[i] = source_name(Source::env, "");
    }
  }
  return std::nullopt;
}

CommandLine::CommandLine() : cli_("crewd: an HTTP service on crew pools (docs/crewd.md)", "crewd") {
  const auto& all = settings();
  cli_.footer(
      "Each setting is also read from a TOML file (--config, or CREWD_CONFIG; keys as in\n"
      "--print-config) and from the environment variable CREWD_<KEY> ('.' -> '_', upper\n"
      "case); flags override the environment, which overrides the file.\n"
      "Exit codes: 0 ok, 1 runtime failure, 2 usage, 3 start-up failure, 4 termination\n"
      "timeout, 5 forced by a second signal, 6 shutdown failure, 78 configuration error.");
  cli_.add_option("--config", config_file_, "TOML file to read settings from (env CREWD_CONFIG)");
  cli_.add_flag("--print-config", print_config_,
                "print the effective configuration as TOML and exit");
  values_.resize(all.size());
  options_.resize(all.size());
  const Config defaults;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Setting& s = all[i];
    options_[i] = cli_.add_option(
        flag_name(s.key), values_[i],
        s.help + " (default " + s.show(defaults) + ", env " + env_name(s.key) + ")");
    options_[i]->type_name("VALUE");
  }
  // Removed settings: not in --help, but named in the error if given.
  const auto removed = removed_settings();
  removed_values_.resize(removed.size());
  for (std::size_t i = 0; i < removed.size(); ++i) {
    removed_options_.push_back(
        cli_.add_option(flag_name(removed[i].key), removed_values_[i])->group(""));
  }
}

std::optional<CommandLine::Stop> CommandLine::parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  argv.reserve(args.size() + 1);
  argv.push_back("crewd");
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    cli_.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    return Stop{.exit_code = 0, .out = cli_.help(), .err = {}};
  } catch (const CLI::ParseError& e) {
    return Stop{
        .exit_code = kUsageExit,
        .out = {},
        .err = std::string("crewd: ") + e.what() + "\nRun with --help for more information.\n"};
  }
  return std::nullopt;
}

std::optional<std::string> CommandLine::apply(Config& config, Origins& origins) const {
  const auto& all = settings();
  const auto removed = removed_settings();
  for (std::size_t i = 0; i < removed_options_.size(); ++i) {
    if (removed_options_[i]->count() == 0) continue;
    return "crewd: configuration error: " + std::string(removed[i].key) + " = " +
           shown_value(removed_values_[i]) + " (from flag " + flag_name(removed[i].key) +
           "): " + std::string(removed[i].why) + "\n";
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Setting& s = all[i];
    if (options_[i]->count() == 0) continue;
    if (auto err = s.from_text(config, values_[i])) {
      return error_line(s.key, shown_value(values_[i]), "from flag " + flag_name(s.key), *err);
    }
    origins[i] = source_name(Source::flag, "");
  }
  return std::nullopt;
}

}  // namespace crewd

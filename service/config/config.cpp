// load_config (service/config/config.hpp): the command line first (for --help,
// --config and --print-config), then the sources in order, each overriding
// the one before (config_sources.hpp): the TOML file, the environment, the
// flags; then the checks across settings and the listen host's resolution
// (config_validate.hpp). The settings themselves are in settings.hpp.
//
// Runs once, on main's thread, before crewd starts any other thread.
#include "config/config.hpp"

#include <algorithm>
#include <utility>

#include "config/config_sources.hpp"
#include "config/config_validate.hpp"
#include "config/settings.hpp"

namespace crewd {

LoadResult load_config(const std::vector<std::string>& args, const Environment& env) {
  LoadResult result;
  const auto& all = settings();
  Origins sources(all.size(), source_name(Source::defaults, ""));

  CommandLine flags;
  if (auto stop = flags.parse(args)) {
    result.out = std::move(stop->out);
    result.err = std::move(stop->err);
    result.exit_code = stop->exit_code;
    return result;
  }

  Config config;
  const auto fail = [&](std::string message) {
    result.err = std::move(message);
    result.exit_code = kConfigErrorExit;
    return result;
  };

  // 1. The file.
  std::string config_file = flags.config_file();
  if (config_file.empty()) {
    if (const auto it = env.find("CREWD_CONFIG"); it != env.end()) config_file = it->second;
  }
  if (!config_file.empty()) {
    if (auto err = read_config_file(config_file, config, sources)) return fail(std::move(*err));
    result.config_file = config_file;
  }
  // 2. The environment.
  if (auto err = read_environment(env, config, sources)) return fail(std::move(*err));
  // 3. The flags.
  if (auto err = flags.apply(config, sources)) return fail(std::move(*err));

  if (auto err = cross_check(config)) return fail("crewd: configuration error: " + *err + "\n");
  // Where the value of setting `key` came from, as an error line says it.
  const auto from = [&](std::string_view key) -> std::string {
    const auto i = static_cast<std::size_t>(
        std::find_if(all.begin(), all.end(), [key](const Setting& st) { return st.key == key; }) -
        all.begin());
    const std::string& src = sources[i];
    return src == "flag"      ? "from flag " + flag_name(key)
           : src == "env"     ? "from env " + env_name(key)
           : src == "default" ? std::string("default")
                              : "from " + src;
  };
  if (const std::string why = resolve_error(config.host); !why.empty()) {
    return fail(error_line("listen", shown_value(listen_text(config)), from("listen"),
                           "cannot resolve host " + shown_value(config.host) + ": " + why));
  }
  // The downstream of call jobs is resolved now, so that a name that does
  // not resolve fails start-up rather than every call.
  if (const auto url = parse_http_url(config.jobs.call_url)) {
    if (const std::string why = resolve_error(url->host); !why.empty()) {
      return fail(error_line("jobs.call_url", shown_value(config.jobs.call_url),
                             from("jobs.call_url"),
                             "cannot resolve host " + shown_value(url->host) + ": " + why));
    }
  }

  config.jobs.limits.allow_call = !config.jobs.call_url.empty();
  result.config = config;
  if (flags.print_config()) {
    result.out = to_toml(config, sources);
    result.exit_code = 0;
    return result;
  }
  result.run = true;
  return result;
}

}  // namespace crewd

// loadgen: open-loop HTTP/1.1 load (loadgen.hpp). Prints a line per second
// on stdout and a JSON summary at the end (stdout, or --json FILE).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <variant>

#include "loadgen.hpp"

namespace {

constexpr const char* kUsage = R"(usage: loadgen --url http://HOST:PORT/PATH [options]
  --rate R --duration S        Poisson arrivals at R requests/s for S seconds, or
  --phase RATE:SECONDS[:BODY]  one phase of the schedule (repeat; BODY indexes --body)
  --method M                   GET unless a --body is given (then POST)
  --body TEXT                  request body (repeat for phases that send another)
  --header 'Name: value'       extra request header (repeat)
  --slo-ms MS                  goodput counts 2xx answered within MS of the send time (50)
  --timeout-ms MS              give up on a request MS after its send time (5000)
  --late-ms MS                 a send this far behind its scheduled time is late (1)
  --connections N              keep-alive connections opened before the first send (16)
  --max-connections N          opened on demand up to N; then a request waits (4096)
  --seed N                     the schedule's random seed (1)
  --json FILE                  write the summary there instead of stdout
  --quiet                      no per-second lines
Latencies are taken from each request's scheduled send time.
)";

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "loadgen: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

double number(const char* flag, const char* value) {
  char* end = nullptr;
  const double v = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(v >= 0)) {
    usage_error(std::string(flag) + " wants a number >= 0, not '" + value + "'");
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  loadgen::Options o;
  std::string url, json_path, method;
  double rate = -1, duration = -1;
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--quiet") {
      quiet = true;
      continue;
    }
    if (i + 1 >= argc) usage_error(flag + " wants a value");
    const char* v = argv[++i];
    if (flag == "--url") {
      url = v;
    } else if (flag == "--rate") {
      rate = number("--rate", v);
    } else if (flag == "--duration") {
      duration = number("--duration", v);
    } else if (flag == "--phase") {
      auto p = loadgen::parse_phase(v);
      if (auto* e = std::get_if<std::string>(&p)) usage_error(*e);
      o.phases.push_back(std::get<loadgen::Phase>(p));
    } else if (flag == "--method") {
      method = v;
    } else if (flag == "--body") {
      o.bodies.emplace_back(v);
    } else if (flag == "--header") {
      o.headers.emplace_back(v);
    } else if (flag == "--slo-ms") {
      o.slo_ns = static_cast<std::int64_t>(number("--slo-ms", v) * 1e6);
    } else if (flag == "--timeout-ms") {
      o.timeout_ns = static_cast<std::int64_t>(number("--timeout-ms", v) * 1e6);
    } else if (flag == "--late-ms") {
      o.late_ns = static_cast<std::int64_t>(number("--late-ms", v) * 1e6);
    } else if (flag == "--connections") {
      o.connections = static_cast<unsigned>(number("--connections", v));
    } else if (flag == "--max-connections") {
      o.max_connections = static_cast<unsigned>(number("--max-connections", v));
    } else if (flag == "--seed") {
      o.seed = static_cast<std::uint64_t>(std::strtoull(v, nullptr, 10));
    } else if (flag == "--json") {
      json_path = v;
    } else {
      usage_error("unknown option " + flag);
    }
  }
  if (!loadgen::parse_url(url, o.target)) usage_error("--url wants http://HOST[:PORT][/PATH]");
  if (rate >= 0 || duration >= 0) {
    if (rate < 0 || duration <= 0 || !o.phases.empty()) {
      usage_error("give --rate with --duration, or --phase, not both");
    }
    o.phases.push_back({.rate = rate, .seconds = duration, .body = 0});
  }
  if (o.phases.empty()) usage_error("no schedule: give --rate and --duration, or --phase");
  if (o.max_connections == 0) usage_error("--max-connections must be at least 1");
  o.method = !method.empty() ? method : o.bodies.empty() ? "GET" : "POST";
  if (!quiet) {
    o.on_second = [](const std::string& line) {
      std::fputs(line.c_str(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    };
  }
  try {
    const loadgen::Result r = loadgen::run(o);
    const std::string json = loadgen::summary_json(r, o);
    if (json_path.empty()) {
      std::fputs(json.c_str(), stdout);
    } else {
      std::ofstream(json_path) << json;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loadgen: %s\n", e.what());
    return 1;
  }
  return 0;
}

// bench/options.hpp: crew_bench's command line (--help lists it): what to
// run, how many rounds, where the JSON goes. Parsed once by main.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace bench {

struct Options {
  std::size_t tasks = 1'000'000;
  std::size_t rounds = 9;
  double idle_seconds = 5;
  std::string json_path;
  std::vector<std::string> impls;      // empty: all
  std::vector<std::string> workloads;  // empty: all ("latency" included)
  bool fj_stack = true;
  std::size_t fj_matrix = 0;  // > 0: run the completion matrix this many times
  std::vector<double> latency_rates = {100'000, 500'000, 1'000'000};
  double latency_seconds = 2;
  bool latency_search = true;
  std::string latency_trace;  // a directory; empty: no traces
};

// Prints `why` and the usage text, and exits with status 2.
[[noreturn]] void usage_error(const std::string& why);

// The options of `argv`; exits with the usage text (status 2) on a bad one.
Options parse_args(int argc, char** argv);

}  // namespace bench

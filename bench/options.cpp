// crew_bench's command line (bench/options.hpp).
#include "options.hpp"

#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "forkjoin.hpp"
#include "harness.hpp"

namespace bench {
namespace {

constexpr std::string_view kUsage =
    "usage: crew_bench [--tasks N] [--rounds R] [--json PATH] [--idle-seconds S]\n"
    "                  [--impl a,b,...] [--workload a,b,...] [--fj-size w=n,...]\n"
    "                  [--fj-stack 0|1] [--fj-isolate 0|1] [--fj-timeout S] [--fj-matrix N]\n"
    "                  [--latency-rates r,...] [--latency-seconds S] [--latency-search 0|1]\n"
    "                  [--latency-trace DIR]\n"
    "  --tasks N          tasks per measurement (default 1000000)\n"
    "  --rounds R         interleaved rounds; medians are over these (default 9)\n"
    "  --json PATH        also write the results as a JSON array\n"
    "  --idle-seconds S   idle-CPU window per configuration; 0 skips it (default 5)\n"
    "  --impl LIST        crew,crew_unbounded,crew_fifo,crew_priority,crew_metrics,\n"
    "                     crew_null_observer,crew_task,tbb_enqueue,tbb_task_group,\n"
    "                     tbb_parallel_for,asio,thread_pool_deb,polling_thread (latency\n"
    "                     only: one thread polling a ring, the machine's floor)\n"
    "  --workload LIST    short_detached,short_future,producers_4,factorial,long_deadline,\n"
    "                     queue_deadline,group_wait,funcpool_invoke,parallel_for,fib,\n"
    "                     skynet,nqueens,matmul,three_pools,one_pool,latency\n"
    "  --fj-size LIST     fork-join sizes (default fib=30,skynet=6,nqueens=11,matmul=1024)\n"
    "  --fj-stack 0|1     one more run per fork-join pair measuring stack depth (default 1)\n"
    "  --fj-isolate 0|1   crew's fork-join runs in a child process (default 1)\n"
    "  --fj-timeout S     an isolated run still going after S seconds fails (default 60)\n"
    "  --fj-matrix N      instead of the rounds: run crew (Group) and crew_task N times\n"
    "                     each on 1 and 2 workers, default and unbounded queue, at the\n"
    "                     --fj-size sizes, and count the runs that completed\n"
    "  --latency-rates L  target tasks/s of the latency workload (default\n"
    "                     100000,500000,1000000)\n"
    "  --latency-seconds S  how long the producer sends per run (default 2)\n"
    "  --latency-search 0|1 find the highest rate crew sustains first (default 1)\n"
    "  --latency-trace DIR  write each latency run's tasks to DIR/latency-IMPL-RATE-rROUND.tsv\n"
    "                     (send time, scheduling latency, producer lateness, CPU; see\n"
    "                     bench/latency_clusters.py)\n";

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::size_t parse_count(const std::string& flag, const std::string& value, std::size_t min) {
  try {
    std::size_t used = 0;
    const unsigned long long v = std::stoull(value, &used);
    if (used == value.size() && v >= min) return static_cast<std::size_t>(v);
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs an integer >= " + std::to_string(min));
}

bool parse_bool(const std::string& flag, const std::string& value) {
  if (value == "0" || value == "1") return value == "1";
  usage_error(flag + " needs 0 or 1");
}

double parse_positive(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  usage_error(flag + " needs a number > 0");
}

void parse_fj_sizes(const std::string& value) {
  ForkJoinConfig& c = fork_join_config();
  for (const std::string& item : split_list(value)) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) usage_error("--fj-size needs NAME=N items");
    const std::string name = item.substr(0, eq);
    const auto n = static_cast<unsigned>(parse_count("--fj-size " + name, item.substr(eq + 1), 0));
    Workload w{};
    if (name == "fib") {
      w = Workload::fib;
      c.fib = n;
    } else if (name == "skynet") {
      w = Workload::skynet;
      c.skynet = n;
    } else if (name == "nqueens") {
      w = Workload::nqueens;
      c.nqueens = n;
    } else if (name == "matmul") {
      w = Workload::matmul;
      c.matmul = n;
    } else {
      usage_error("--fj-size: not a fork-join workload: " + name);
    }
    if (const std::string why = fork_join_size_error(w, n); !why.empty()) {
      usage_error("--fj-size " + why);
    }
  }
}

}  // namespace

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "crew_bench: " << why << "\n" << kUsage;
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("unknown option or missing value: " + arg);
    const std::string value = argv[++i];
    if (arg == "--tasks") {
      o.tasks = parse_count(arg, value, 1);
    } else if (arg == "--rounds") {
      o.rounds = parse_count(arg, value, 1);
    } else if (arg == "--idle-seconds") {
      try {
        o.idle_seconds = std::stod(value);
      } catch (const std::exception&) {
        usage_error("--idle-seconds needs a number");
      }
      if (o.idle_seconds < 0) usage_error("--idle-seconds must be >= 0");
    } else if (arg == "--json") {
      o.json_path = value;
    } else if (arg == "--impl") {
      o.impls = split_list(value);
    } else if (arg == "--workload") {
      o.workloads = split_list(value);
    } else if (arg == "--fj-size") {
      parse_fj_sizes(value);
    } else if (arg == "--fj-stack") {
      o.fj_stack = parse_bool(arg, value);
    } else if (arg == "--fj-matrix") {
      o.fj_matrix = parse_count(arg, value, 1);
    } else if (arg == "--fj-isolate") {
      fork_join_config().isolate = parse_bool(arg, value);
    } else if (arg == "--fj-timeout") {
      fork_join_config().timeout_seconds = static_cast<int>(parse_count(arg, value, 1));
    } else if (arg == "--latency-rates") {
      o.latency_rates.clear();
      for (const std::string& r : split_list(value)) {
        o.latency_rates.push_back(parse_positive(arg, r));
      }
    } else if (arg == "--latency-seconds") {
      o.latency_seconds = parse_positive(arg, value);
    } else if (arg == "--latency-search") {
      o.latency_search = parse_bool(arg, value);
    } else if (arg == "--latency-trace") {
      if (value.empty() || ::access(value.c_str(), W_OK | X_OK) != 0) {
        usage_error("--latency-trace: " + value + " is not a writable directory");
      }
      o.latency_trace = value;
    } else {
      usage_error("unknown option: " + arg);
    }
  }
  return o;
}

}  // namespace bench

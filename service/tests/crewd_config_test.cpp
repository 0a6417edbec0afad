// Configuration layering (defaults < TOML file < CREWD_* environment <
// flags), error messages naming the setting, --help and --print-config,
// and the defaults crewd sizes from the CPUs it may use.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "affinity.hpp"
#include "config/config.hpp"
#include "crewd_harness.hpp"
#include "crewd_suite.hpp"
#include "fake_cgroup.hpp"

namespace crewd {
namespace {

using namespace std::chrono_literals;

Environment env_of(std::map<std::string, std::string> vars) { return vars; }

// A TOML file that removes itself.
class TomlFile {
 public:
  explicit TomlFile(const std::string& text) {
    char name[] = "/tmp/crewd_config_test_XXXXXX";
    const int fd = ::mkstemp(name);
    path_ = name;
    ::close(fd);
    std::ofstream(path_) << text;
  }
  ~TomlFile() { std::remove(path_.c_str()); }
  TomlFile(const TomlFile&) = delete;
  TomlFile& operator=(const TomlFile&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(CrewdConfig, EverySettingHasAWorkingDefault) {
  const LoadResult r = load_config({}, env_of({}));
  ASSERT_TRUE(r.run) << r.err;
  EXPECT_EQ(r.config.host, "127.0.0.1");
  EXPECT_EQ(r.config.port, 8080);
  EXPECT_EQ(r.config.shutdown.mode, crew::ShutdownMode::drain);
  EXPECT_LT(r.config.shutdown.timeout, r.config.shutdown.termination_timeout);
}

TEST(CrewdConfig, FlagsOverrideEnvironmentWhichOverridesTheFile) {
  const TomlFile file(R"(
listen = "127.0.0.1:9000"
log_level = "warning"
[http]
max_connections = 10
body_limit = 1000
[shutdown]
mode = "soft"
timeout_ms = 3000
)");
  const LoadResult r =
      load_config({"--config", file.path(), "--http-max-connections", "30"},
                  env_of({{"CREWD_HTTP_MAX_CONNECTIONS", "20"}, {"CREWD_LISTEN", "0.0.0.0:9001"}}));
  ASSERT_TRUE(r.run) << r.err;
  EXPECT_EQ(r.config.http.max_connections, 30u);  // flag over env over file
  EXPECT_EQ(r.config.host, "0.0.0.0");            // env over file
  EXPECT_EQ(r.config.port, 9001);
  EXPECT_EQ(r.config.http.body_limit, 1000u);  // file over default
  EXPECT_EQ(r.config.log_level, crew::LogLevel::warning);
  EXPECT_EQ(r.config.shutdown.mode, crew::ShutdownMode::soft);
  EXPECT_EQ(r.config.shutdown.timeout, 3000ms);
  EXPECT_EQ(r.config.jobs.workers, Config{}.jobs.workers);  // untouched: default
}

TEST(CrewdConfig, TheFileCanComeFromTheEnvironment) {
  const TomlFile file("[jobs]\nmax_ms = 123\n");
  const LoadResult r = load_config({}, env_of({{"CREWD_CONFIG", file.path()}}));
  ASSERT_TRUE(r.run) << r.err;
  EXPECT_EQ(r.config.jobs.limits.max_ms, 123u);
  EXPECT_EQ(r.config_file, file.path());
}

TEST(CrewdConfig, ABadValueNamesTheSettingAndWhereItCameFrom) {
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--http-max-connections", "0"},
       {},
       "http.max_connections = \"0\" (from flag --http-max-connections): must be an integer in "
       "1..1000000"},
      {{"--http-max-connections", "-3"},
       {},
       "http.max_connections = \"-3\" (from flag --http-max-connections): must be an integer"},
      {{"--http-head-timeout-ms", "soon"},
       {},
       "http.head_timeout_ms = \"soon\" (from flag --http-head-timeout-ms): must be an integer"},
      {{},
       {{"CREWD_JOBS_QUEUE", "many"}},
       "jobs.queue = \"many\" (from env CREWD_JOBS_QUEUE): must be an integer"},
      {{"--listen", "localhost"},
       {},
       "listen = \"localhost\" (from flag --listen): must be HOST:PORT"},
      {{"--listen", "127.0.0.1:70000"},
       {},
       "listen = \"127.0.0.1:70000\" (from flag --listen): must be HOST:PORT or [IPV6]:PORT with "
       "a port in 0..65535"},
      {{"--listen", "[::1:8080"}, {}, "listen = \"[::1:8080\" (from flag --listen): must be"},
      {{"--listen", "[nothex]:8080"}, {}, "must be HOST:PORT or [IPV6]:PORT"},
      {{"--listen", "300.1.1.1:8080"},
       {},
       "listen = \"300.1.1.1:8080\" (from flag --listen): cannot resolve host \"300.1.1.1\": "},
      {{},
       {{"CREWD_LISTEN", "no-such-host.invalid:80"}},
       "listen = \"no-such-host.invalid:80\" (from env CREWD_LISTEN): cannot resolve host"},
      {{},
       {{"CREWD_SHUTDOWN_MODE", "gentle"}},
       "shutdown.mode = \"gentle\" (from env CREWD_SHUTDOWN_MODE): must be one of drain, soft, "
       "hard"},
      {{"--log-level", "loud"},
       {},
       "log_level = \"loud\" (from flag --log-level): must be one of debug, info, warning, error"},
      {{},
       {{"CREWD_COMPUTE_WORKER_POLICY", "fast"}},
       "compute.worker_policy = \"fast\" (from env CREWD_COMPUTE_WORKER_POLICY): must be one of "
       "batch, normal"},
      {{"--compute-inline-factorial", "maybe"},
       {},
       "compute.inline_factorial = \"maybe\" (from flag --compute-inline-factorial): must be true "
       "or false"},
      {{"--shutdown-timeout-ms", "30000"},
       {},
       "shutdown.timeout_ms (30000) must be less than shutdown.termination_timeout_ms (20000)"},
      {{"--jobs-default-timeout-ms", "90000"},
       {},
       "jobs.default_timeout_ms (90000) must not exceed jobs.max_timeout_ms (60000)"},
      {{"--jobs-call-url", "https://127.0.0.1/x"},
       {},
       "jobs.call_url = \"https://127.0.0.1/x\" (from flag --jobs-call-url): must be "
       "http://HOST[:PORT]/PATH"},
      {{},
       {{"CREWD_JOBS_CALL_URL", "http://127.0.0.1:0/x"}},
       "jobs.call_url = \"http://127.0.0.1:0/x\" (from env CREWD_JOBS_CALL_URL): must be "
       "http://HOST[:PORT]/PATH"},
      {{"--jobs-call-url", "http://no-such-host.invalid:8080/x"},
       {},
       "jobs.call_url = \"http://no-such-host.invalid:8080/x\" (from flag --jobs-call-url): "
       "cannot resolve host \"no-such-host.invalid\""},
      {{"--jobs-max-in-flight", "0"},
       {},
       "jobs.max_in_flight = \"0\" (from flag --jobs-max-in-flight): must be an integer in "
       "1..1000000"},
      {{"--jobs-call-timeout-ms", "0"},
       {},
       "jobs.call_timeout_ms = \"0\" (from flag --jobs-call-timeout-ms): must be an integer"},
  };
  for (const Case& c : cases) {
    const LoadResult r = load_config(c.args, env_of(c.env));
    EXPECT_FALSE(r.run);
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << "got: " << r.err;
  }
}

TEST(CrewdConfig, TheFileIsCheckedForTypesTyposAndSyntax) {
  {
    // The offending value is shown as written.
    const TomlFile file("[http]\nmax_connections = \"ten\"\n");
    const LoadResult r = load_config({"--config", file.path()}, env_of({}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("http.max_connections = \"ten\" (from file " + file.path() +
                         ", line 2): must be an integer in 1..1000000"),
              std::string::npos)
        << r.err;
  }
  {
    const TomlFile file("[jobs]\nworkers = 2.5\n[shutdown]\nmode = 3\n");
    const LoadResult r = load_config({"--config", file.path()}, env_of({}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("jobs.workers = 2.5 (from file " + file.path() + ", line 2)"),
              std::string::npos)
        << r.err;
  }
  {
    const TomlFile file("[http]\nmax_conections = 10\n");
    const LoadResult r = load_config({"--config", file.path()}, env_of({}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("unknown setting http.max_conections in " + file.path() +
                         " (line 2) (did you mean http.max_connections?)"),
              std::string::npos)
        << r.err;
  }
  {
    // A setting that was removed says so, and what replaced it.
    const TomlFile file("[http]\nworkers = 10\n");
    const LoadResult r = load_config({"--config", file.path()}, env_of({}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("http.workers in " + file.path() + " (line 2): removed"),
              std::string::npos)
        << r.err;
  }
  {
    const TomlFile file("[http\nworkers = 10\n");
    const LoadResult r = load_config({"--config", file.path()}, env_of({}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("cannot read " + file.path()), std::string::npos) << r.err;
  }
  {
    const LoadResult r = load_config({"--config", "/nonexistent/crewd.toml"}, env_of({}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("cannot read /nonexistent/crewd.toml"), std::string::npos) << r.err;
  }
}

TEST(CrewdConfig, AnUnknownCrewdVariableIsAnErrorNamingIt) {
  {
    const LoadResult r = load_config({}, env_of({{"CREWD_HTTP_WORKERZ", "5"}}));
    EXPECT_FALSE(r.run);
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("unknown environment variable CREWD_HTTP_WORKERZ=\"5\""),
              std::string::npos)
        << r.err;
  }
  {
    const LoadResult r = load_config({}, env_of({{"CREWD_JOBS_WORKER", "5"}}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("(did you mean CREWD_JOBS_WORKERS?)"), std::string::npos) << r.err;
  }
  {
    const LoadResult r = load_config({}, env_of({{"CREWD_COMPUTE_HELP", "false"}}));
    EXPECT_EQ(r.exit_code, kConfigErrorExit);
    EXPECT_NE(r.err.find("CREWD_COMPUTE_HELP=\"false\" (env): compute.help removed"),
              std::string::npos)
        << r.err;
  }
  // Not CREWD_*: none of crewd's business. Kubernetes' service links for a
  // Service named crewd: ignored.
  const LoadResult ok = load_config({}, env_of({{"CREWDX", "1"},
                                                {"CREWD_SERVICE_HOST", "10.0.0.1"},
                                                {"CREWD_SERVICE_PORT", "80"},
                                                {"CREWD_SERVICE_PORT_HTTP", "80"},
                                                {"CREWD_PORT", "tcp://10.0.0.1:80"},
                                                {"CREWD_PORT_80_TCP", "tcp://10.0.0.1:80"},
                                                {"CREWD_PORT_80_TCP_PROTO", "tcp"},
                                                {"CREWD_PORT_80_TCP_PORT", "80"},
                                                {"CREWD_PORT_80_TCP_ADDR", "10.0.0.1"}}));
  EXPECT_TRUE(ok.run) << ok.err;
}

TEST(CrewdConfig, ListenTakesIpv6InBrackets) {
  const LoadResult r = load_config({"--listen", "[::1]:8081"}, env_of({}));
  ASSERT_TRUE(r.run) << r.err;
  EXPECT_EQ(r.config.host, "::1");
  EXPECT_EQ(r.config.port, 8081);
  const LoadResult printed = load_config({"--listen", "[::1]:8081", "--print-config"}, env_of({}));
  EXPECT_NE(printed.out.find("listen = \"[::1]:8081\""), std::string::npos) << printed.out;
}

TEST(CrewdConfig, ARemovedSettingSaysWhatReplacedIt) {
  const LoadResult r = load_config({"--http-workers", "512"}, env_of({}));
  EXPECT_FALSE(r.run);
  EXPECT_EQ(r.exit_code, kConfigErrorExit);
  EXPECT_NE(r.err.find("http.workers = \"512\" (from flag --http-workers): removed: connections "
                       "no longer take a thread each"),
            std::string::npos)
      << r.err;
  const LoadResult help = load_config({"--help"}, env_of({}));
  EXPECT_EQ(help.out.find("--http-workers"), std::string::npos) << "not offered in --help";
}

TEST(CrewdConfig, AnUnknownFlagIsAUsageError) {
  const LoadResult r = load_config({"--no-such-flag"}, env_of({}));
  EXPECT_FALSE(r.run);
  EXPECT_EQ(r.exit_code, kUsageExit);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
}

TEST(CrewdConfig, PrintedConfigurationReadsBackAsTheSameConfiguration) {
  const LoadResult first =
      load_config({"--print-config", "--jobs-workers", "7", "--shutdown-mode", "hard",
                   "--compute-inline-factorial", "true", "--compute-spin-when-contended", "true",
                   "--http-keep-alive-timeout-s", "9", "--http-header-limit", "4096"},
                  env_of({}));
  ASSERT_FALSE(first.run);
  ASSERT_EQ(first.exit_code, 0);
  EXPECT_NE(first.out.find("workers = 7"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("[flag]"), std::string::npos) << first.out;
  const TomlFile file(first.out);
  const LoadResult second = load_config({"--config", file.path()}, env_of({}));
  ASSERT_TRUE(second.run) << second.err;
  EXPECT_EQ(second.config.jobs.workers, 7u);
  EXPECT_EQ(second.config.shutdown.mode, crew::ShutdownMode::hard);
  EXPECT_TRUE(second.config.compute.inline_factorial);
  EXPECT_TRUE(second.config.compute.spin_when_contended);
  EXPECT_EQ(second.config.http.keep_alive_timeout, 9s);
  EXPECT_EQ(second.config.http.header_limit, 4096u);
  EXPECT_EQ(to_toml(second.config), to_toml(first.config));
}

TEST(CrewdConfig, NamesFollowTheKey) {
  EXPECT_EQ(env_name("shutdown.termination_timeout_ms"), "CREWD_SHUTDOWN_TERMINATION_TIMEOUT_MS");
  EXPECT_EQ(flag_name("shutdown.termination_timeout_ms"), "--shutdown-termination-timeout-ms");
  EXPECT_EQ(env_name("listen"), "CREWD_LISTEN");
}

// The binary itself: what an operator sees.
TEST(CrewdBinary, HelpListsEverySettingWithItsDefaultAndVariable) {
  const auto [code, out] = test::run_crewd({"--help"});
  EXPECT_EQ(code, 0);
  for (const char* s : {"--listen", "CREWD_LISTEN", "--shutdown-termination-timeout-ms",
                        "--http-body-limit", "--print-config", "78 configuration error"}) {
    EXPECT_NE(out.find(s), std::string::npos) << s << " missing from\n" << out;
  }
}

TEST(CrewdBinary, PrintConfigShowsTheEffectiveValues) {
  const auto [code, out] = test::run_crewd({"--print-config"}, {{"CREWD_LISTEN", "0.0.0.0:8081"}});
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("listen = \"0.0.0.0:8081\""), std::string::npos) << out;
  EXPECT_NE(out.find("termination_timeout_ms = 20000"), std::string::npos) << out;
}

TEST(CrewdBinary, ABadValueStopsStartUpWithTheConfigurationExitCode) {
  const auto [code, out] = test::run_crewd({"--jobs-max-ms", "soon"});
  EXPECT_EQ(code, kConfigErrorExit);
  EXPECT_NE(out.find("jobs.max_ms = \"soon\" (from flag --jobs-max-ms)"), std::string::npos) << out;
}

TEST(CrewdBinary, AnUnresolvableListenAddressIsAConfigurationError) {
  const auto [code, out] = test::run_crewd({"--listen", "300.1.1.1:8080"});
  EXPECT_EQ(code, kConfigErrorExit) << out;
  EXPECT_NE(out.find("listen = \"300.1.1.1:8080\" (from flag --listen): cannot resolve host "
                     "\"300.1.1.1\": "),
            std::string::npos)
      << out;
}

TEST(CrewdBinary, AnUnknownVariableStopsStartUp) {
  const auto [code, out] = test::run_crewd({"--print-config"}, {{"CREWD_HTTP_WORKERZ", "5"}});
  EXPECT_EQ(code, kConfigErrorExit) << out;
  EXPECT_NE(out.find("CREWD_HTTP_WORKERZ"), std::string::npos) << out;
}

TEST(CrewdBinary, ListensOnIpv6Loopback) {
  test::Crewd crewd({"--listen", "[::1]:0"});
  std::vector<std::string> m;
  const std::string line = crewd.wait_log("listening on http://\\[::1\\]:([0-9]+)", 10'000ms, &m);
  if (line.empty() && crewd.log().find("cannot listen") != std::string::npos) {
    GTEST_SKIP() << "no IPv6 loopback here: " << crewd.log();
  }
  ASSERT_FALSE(line.empty()) << crewd.log();
  const int port = std::stoi(m[1]);
  test::Socket s(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(static_cast<std::uint16_t>(port));
  addr.sin6_addr = in6addr_loopback;
  ASSERT_EQ(::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  int err = 0;
  ASSERT_TRUE(test::write_all(s.fd(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", err));
  test::Exchange ex;
  test::read_response(s.fd(), ex, test::Clock::now() + 5s * test::kSlowdown);
  EXPECT_EQ(ex.status, 200);
}

TEST(CrewdBinary, APortInUseFailsStartUp) {
  test::Crewd first({"--listen", "127.0.0.1:0"});
  const int port = first.wait_port();
  ASSERT_GT(port, 0) << first.log();
  const auto [code, out] = test::run_crewd({"--listen", "127.0.0.1:" + std::to_string(port)});
  EXPECT_EQ(code, 3) << out;  // crew::ExitCode::startup_failure
  EXPECT_NE(out.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << out;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
}

// The value of the unlabelled gauge `name` in crewd's /metrics, or -1.
double gauge(int port, const std::string& name) {
  const test::Exchange ex = test::get(port, "/metrics");
  const auto pos = ex.body.find("\n" + name + " ");
  if (ex.status != 200 || pos == std::string::npos) return -1;
  return std::stod(ex.body.substr(pos + name.size() + 2));
}

TEST(CrewdBinary, UnderTasksetItLogsOneUsableCpuAndSizesItsDefaultsFromIt) {
  const int cpu = crew::test::first_cpu();
  ASSERT_GE(cpu, 0);
  test::Crewd crewd({"--listen", "127.0.0.1:0"}, {}, 0,
                    {"/usr/bin/taskset", "-c", std::to_string(cpu)});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  EXPECT_FALSE(
      crewd.wait_log(R"(usable CPUs: 1 \(from affinity: 1 in the affinity mask)", 5'000ms).empty())
      << crewd.log();
  // One I/O thread and one compute worker per usable CPU.
  EXPECT_FALSE(
      crewd.wait_log(R"(ready: 1 I/O threads .*compute \(max 1 workers\))", 5'000ms).empty())
      << crewd.log();
  EXPECT_EQ(gauge(port, "crewd_usable_cpus"), 1);
  test::expect_clean_stop(crewd);
}

// A fake cgroup v2 tree (CREW_TEST_CGROUP_ROOT, crew/usable_cpus.hpp)
// with a quota of half a CPU: the quota is the limit crewd names.
TEST(CrewdBinary, ItLogsACgroupQuotaAsTheSourceOfItsUsableCpus) {
  if (affinity_cpus() < 2) {
    GTEST_SKIP() << "needs 2 CPUs in the affinity mask for the quota to be the smaller limit";
  }
  const crew::test::FakeCgroups cgroups;
  cgroups.write("proc_self_cgroup", "0::/pod/crewd\n");
  cgroups.write("sys_fs_cgroup/pod/crewd/cpu.max", "50000 100000\n");
  test::Crewd crewd({"--listen", "127.0.0.1:0"},
                    {{crew::test::kCgroupRootVariable, cgroups.root()}});
  const int port = crewd.wait_port();
  ASSERT_GT(port, 0) << crewd.log();
  const std::string expected =
      "usable CPUs: 1 (from cgroup_v2_quota: " + std::to_string(affinity_cpus()) +
      " in the affinity mask, cgroup CPU quota 0.50 at " + cgroups.path("sys_fs_cgroup/pod/crewd") +
      ")";
  EXPECT_NE(crewd.log().find(expected), std::string::npos) << expected << "\n" << crewd.log();
  EXPECT_EQ(gauge(port, "crewd_usable_cpus"), 1);
  test::expect_clean_stop(crewd);
}

}  // namespace
}  // namespace crewd

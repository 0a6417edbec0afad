// crewd's /metrics against the real consumers: Debian's Prometheus server
// scrapes crewd (1 s interval) and its query API must see the factorial
// tasks counted; `promtool check metrics` must find nothing to report in
// the exposition. Skipped only when the binaries are not installed
// (scripts/deps.sh test installs package prometheus).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "crewd_harness.hpp"
#include "crewd_suite.hpp"

namespace crewd::test {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";

// A scratch directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "crewd-prom-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp");
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A child process with stdout and stderr in `log`; killed (SIGTERM, then
// SIGKILL) and reaped by the destructor.
class Child {
 public:
  Child(std::vector<std::string> argv, const fs::path& log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const int err = ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) pid_ = -1;
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 5000; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(1ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  [[nodiscard]] bool running() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
};

// A port that was free a moment ago.
int free_port() {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 0;
  }
  return ntohs(addr.sin_port);
}

std::string read_file(const fs::path& p) {
  std::string out;
  if (FILE* f = std::fopen(p.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

// Runs `command` through the shell; returns its exit status and output.
std::pair<int, std::string> shell(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class CrewdPrometheus : public ::testing::Test {
 protected:
  void SetUp() override {
    crewd_ = std::make_unique<Crewd>(std::vector<std::string>{"--listen", "127.0.0.1:0"});
    port_ = crewd_->wait_port();
    ASSERT_GT(port_, 0) << crewd_->log();
  }
  void TearDown() override { expect_clean_stop(*crewd_); }

  std::unique_ptr<Crewd> crewd_;
  int port_ = 0;
};

TEST_F(CrewdPrometheus, PromtoolFindsNoProblemInTheExposition) {
  if (::access(kPromtool, X_OK) != 0) {
    GTEST_SKIP() << kPromtool << " not installed (package prometheus)";
  }
  // Every family with samples: a request of each route, a job.
  ASSERT_EQ(get(port_, "/api/v1/factorial/12").status, 200);
  ASSERT_EQ(post(port_, "/api/v1/jobs", R"({"kind":"sleep","ms":1})").status, 200);
  ASSERT_EQ(get(port_, "/api/v1/nothing").status, 404);
  ASSERT_EQ(get(port_, "/api/v1/pools").status, 200);
  const Exchange ex = get(port_, "/metrics");
  ASSERT_EQ(ex.status, 200);
  ASSERT_NE(ex.body.find("crewd_http_requests_total"), std::string::npos);
  TempDir dir;
  const fs::path file = dir.path() / "metrics.txt";
  std::ofstream(file) << ex.body;
  const auto [status, output] = shell(std::string(kPromtool) + " check metrics < " + file.string());
  EXPECT_EQ(status, 0) << output;
  EXPECT_EQ(output, "") << "promtool reports problems";
}

TEST_F(CrewdPrometheus, ThePrometheusServerScrapesTheFactorialTaskCounter) {
  if (::access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " not installed (package prometheus)";
  }
  TempDir dir;
  const int prom_port = free_port();
  ASSERT_GT(prom_port, 0);
  std::ofstream(dir.path() / "prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: crewd\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << port_ << "']\n";
  const fs::path log = dir.path() / "prometheus.log";
  Child prometheus(
      {kPrometheus, "--config.file=" + (dir.path() / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (dir.path() / "data").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"},
      log);

  for (int i = 0; i < 50; ++i) ASSERT_EQ(get(port_, "/api/v1/factorial/20").status, 200);

  // Bounded: Prometheus starts, scrapes every second; a minute is plenty.
  const std::string query =
      "/api/v1/query?query=sum(crew_tasks_total%7Btask%3D%22factorial%22%2C"
      "outcome%3D%22succeeded%22%7D)";
  const auto deadline = Clock::now() + 60s;
  double value = 0;
  std::string last;
  while (Clock::now() < deadline && value <= 0) {
    ASSERT_TRUE(prometheus.running()) << read_file(log);
    const Exchange ex = get(prom_port, query);
    if (ex.outcome == Exchange::Outcome::response && ex.status == 200) {
      last = ex.body;
      const Json j = Json::parse(ex.body, nullptr, false);
      if (j.is_object() && j.value("status", "") == "success" && !j["data"]["result"].empty()) {
        value = std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
      }
    }
    if (value <= 0) std::this_thread::sleep_for(250ms);
  }
  EXPECT_GE(value, 50.0) << "last answer: " << last << "\n" << read_file(log);

  // The scrape itself was healthy.
  const Exchange up = get(prom_port, "/api/v1/query?query=up%7Bjob%3D%22crewd%22%7D");
  ASSERT_EQ(up.status, 200) << up.body;
  const Json j = Json::parse(up.body, nullptr, false);
  ASSERT_FALSE(j["data"]["result"].empty()) << up.body;
  EXPECT_EQ(j["data"]["result"][0]["value"][1], "1") << up.body;
}

}  // namespace
}  // namespace crewd::test

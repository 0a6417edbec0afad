// Tests of usable_cpus(): the cgroup quota over fake cgroup trees
// (CREW_TEST_CGROUP_ROOT; v1, v2, nested, "max", garbage), the affinity
// mask (this thread pinned, and the whole binary run under taskset), and
// the defaults sized from it.
#include "crew/usable_cpus.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "affinity.hpp"
#include "crew/pool.hpp"
#include "crew/sharded_pool.hpp"
#include "fake_cgroup.hpp"
#include "test_util.hpp"

namespace crew {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::FakeCgroups;
using test::kSlowdown;
using test::Watchdog;

constexpr const char* kRootVariable = test::kCgroupRootVariable;

// The CPUs in this thread's affinity mask, counted here rather than by the
// code under test.
std::size_t affinity_now() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return static_cast<std::size_t>(CPU_COUNT(&set));
}

// Pins the calling thread to its first CPU until destroyed.
class PinnedToOneCpu {
 public:
  PinnedToOneCpu() {
    CPU_ZERO(&saved_);
    ok_ = ::sched_getaffinity(0, sizeof(saved_), &saved_) == 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    const int cpu = test::first_cpu();
    if (cpu >= 0) CPU_SET(static_cast<std::size_t>(cpu), &one);
    ok_ = ok_ && cpu >= 0 && ::sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  PinnedToOneCpu(const PinnedToOneCpu&) = delete;
  PinnedToOneCpu& operator=(const PinnedToOneCpu&) = delete;
  ~PinnedToOneCpu() { ::sched_setaffinity(0, sizeof(saved_), &saved_); }
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  cpu_set_t saved_;
  bool ok_ = false;
};

constexpr const char* kNeedsTwoCpus =
    "needs 2 CPUs in the affinity mask for a quota of 1 CPU to be the smaller limit";

TEST(UsableCpus, AV2QuotaIsRoundedUpToWholeCpus) {
  FakeCgroups t;
  t.write("proc_self_cgroup", "0::/pod/app\n");
  const std::size_t affinity = affinity_now();
  for (const char* max : {"150000 100000\n", "120000 100000\n"}) {
    t.write("sys_fs_cgroup/pod/app/cpu.max", max);
    const UsableCpus u = t.read();
    EXPECT_EQ(u.affinity, affinity);
    EXPECT_EQ(u.count, std::min<std::size_t>(affinity, 2)) << max;
    EXPECT_EQ(u.cgroup, t.path("sys_fs_cgroup/pod/app"));
    EXPECT_EQ(u.limit, affinity > 2 ? CpuLimit::cgroup_v2_quota : CpuLimit::affinity);
  }
  EXPECT_DOUBLE_EQ(t.read().quota, 1.2);
}

TEST(UsableCpus, AV2QuotaBelowTheAffinityMaskDecides) {
  if (affinity_now() < 2) GTEST_SKIP() << kNeedsTwoCpus;
  FakeCgroups t;
  t.write("proc_self_cgroup", "0::/pod/app\n");
  t.write("sys_fs_cgroup/pod/app/cpu.max", "50000 100000\n");
  const UsableCpus u = t.read();
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(u.limit, CpuLimit::cgroup_v2_quota);
  EXPECT_DOUBLE_EQ(u.quota, 0.5);
  EXPECT_EQ(to_string(u.limit), "cgroup_v2_quota");
}

TEST(UsableCpus, V2MaxMeansNoQuota) {
  FakeCgroups t;
  t.write("proc_self_cgroup", "0::/pod/app\n");
  t.write("sys_fs_cgroup/pod/app/cpu.max", "max 100000\n");
  const UsableCpus u = t.read();
  EXPECT_EQ(u.count, affinity_now());
  EXPECT_EQ(u.limit, CpuLimit::affinity);
  EXPECT_EQ(u.quota, 0);
  EXPECT_EQ(u.cgroup, "");
}

TEST(UsableCpus, AV1QuotaIsTheQuotaOverThePeriod) {
  if (affinity_now() < 2) GTEST_SKIP() << kNeedsTwoCpus;
  // Both mount names systems use: cpu and cpuacct together, or cpu alone.
  for (const char* mount : {"cpu,cpuacct", "cpu"}) {
    FakeCgroups t;
    t.write("proc_self_cgroup", "5:memory:/docker/c1\n4:cpu,cpuacct:/docker/c1\n0::/\n");
    t.write(std::string("sys_fs_cgroup/") + mount + "/docker/c1/cpu.cfs_quota_us", "50000\n");
    t.write(std::string("sys_fs_cgroup/") + mount + "/docker/c1/cpu.cfs_period_us", "100000\n");
    const UsableCpus u = t.read();
    EXPECT_EQ(u.count, 1u) << mount;
    EXPECT_EQ(u.limit, CpuLimit::cgroup_v1_quota) << mount;
    EXPECT_EQ(u.cgroup, t.path(std::string("sys_fs_cgroup/") + mount + "/docker/c1"));
  }
}

TEST(UsableCpus, V1MinusOneMeansNoQuota) {
  FakeCgroups t;
  t.write("proc_self_cgroup", "4:cpu,cpuacct:/docker/c1\n");
  t.write("sys_fs_cgroup/cpu,cpuacct/docker/c1/cpu.cfs_quota_us", "-1\n");
  t.write("sys_fs_cgroup/cpu,cpuacct/docker/c1/cpu.cfs_period_us", "100000\n");
  const UsableCpus u = t.read();
  EXPECT_EQ(u.count, affinity_now());
  EXPECT_EQ(u.limit, CpuLimit::affinity);
  EXPECT_EQ(u.cgroup, "");
}

TEST(UsableCpus, AParentsSmallerQuotaBoundsItsChild) {
  if (affinity_now() < 2) GTEST_SKIP() << kNeedsTwoCpus;
  FakeCgroups t;
  t.write("proc_self_cgroup", "0::/kubepods/pod1/app\n");
  t.write("sys_fs_cgroup/kubepods/cpu.max", "max 100000\n");
  t.write("sys_fs_cgroup/kubepods/pod1/cpu.max", "100000 100000\n");
  t.write("sys_fs_cgroup/kubepods/pod1/app/cpu.max", "400000 100000\n");
  UsableCpus u = t.read();
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(u.limit, CpuLimit::cgroup_v2_quota);
  EXPECT_EQ(u.cgroup, t.path("sys_fs_cgroup/kubepods/pod1"));
  // The same on cgroup v1, with the child unlimited.
  FakeCgroups v1;
  v1.write("proc_self_cgroup", "3:cpu:/a/b\n");
  v1.write("sys_fs_cgroup/cpu/a/cpu.cfs_quota_us", "70000\n");
  v1.write("sys_fs_cgroup/cpu/a/cpu.cfs_period_us", "100000\n");
  v1.write("sys_fs_cgroup/cpu/a/b/cpu.cfs_quota_us", "-1\n");
  v1.write("sys_fs_cgroup/cpu/a/b/cpu.cfs_period_us", "100000\n");
  u = v1.read();
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(u.limit, CpuLimit::cgroup_v1_quota);
  EXPECT_EQ(u.cgroup, v1.path("sys_fs_cgroup/cpu/a"));
}

// A container without a cgroup namespace (Docker on cgroup v1) sees its
// host path in /proc/self/cgroup, and its own cgroup mounted as the root.
TEST(UsableCpus, TheMountsRootHoldsTheQuotaWhenTheCgroupPathIsNotMounted) {
  if (affinity_now() < 2) GTEST_SKIP() << kNeedsTwoCpus;
  FakeCgroups t;
  t.write("proc_self_cgroup", "4:cpu,cpuacct:/docker/0123abcd\n");
  t.write("sys_fs_cgroup/cpu,cpuacct/cpu.cfs_quota_us", "100000\n");
  t.write("sys_fs_cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const UsableCpus u = t.read();
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(u.limit, CpuLimit::cgroup_v1_quota);
}

// A hybrid host has both hierarchies; the smaller quota wins.
TEST(UsableCpus, WithBothHierarchiesTheSmallerQuotaWins) {
  if (affinity_now() < 2) GTEST_SKIP() << kNeedsTwoCpus;
  FakeCgroups t;
  t.write("proc_self_cgroup", "2:cpu,cpuacct:/x\n0::/y\n");
  t.write("sys_fs_cgroup/cpu,cpuacct/x/cpu.cfs_quota_us", "300000\n");
  t.write("sys_fs_cgroup/cpu,cpuacct/x/cpu.cfs_period_us", "100000\n");
  t.write("sys_fs_cgroup/y/cpu.max", "100000 100000\n");
  EXPECT_EQ(t.read().limit, CpuLimit::cgroup_v2_quota);
  t.write("sys_fs_cgroup/cpu,cpuacct/x/cpu.cfs_quota_us", "50000\n");
  t.write("sys_fs_cgroup/y/cpu.max", "300000 100000\n");
  const UsableCpus u = t.read();
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(u.limit, CpuLimit::cgroup_v1_quota);
}

TEST(UsableCpus, TheAffinityMaskBelowTheQuotaDecides) {
  FakeCgroups t;
  t.write("proc_self_cgroup", "0::/pod\n");
  t.write("sys_fs_cgroup/pod/cpu.max", "100000000 100000\n");  // 1,000 CPUs
  UsableCpus u = t.read();
  EXPECT_EQ(u.count, affinity_now());
  EXPECT_EQ(u.limit, CpuLimit::affinity);
  EXPECT_DOUBLE_EQ(u.quota, 1000.0);
  // This (the main) thread pinned to one CPU under a quota of 1.5.
  t.write("sys_fs_cgroup/pod/cpu.max", "150000 100000\n");
  const PinnedToOneCpu pinned;
  ASSERT_TRUE(pinned.ok());
  u = t.read();
  EXPECT_EQ(u.affinity, 1u);
  EXPECT_EQ(u.count, 1u);
  EXPECT_EQ(u.limit, CpuLimit::affinity);
}

// Anything but a well-formed limit counts as none: the affinity mask alone.
TEST(UsableCpus, MissingUnreadableOrGarbageFilesFallBackToTheAffinityMask) {
  const std::size_t affinity = affinity_now();
  const auto expect_affinity = [affinity](const FakeCgroups& t, const std::string& what) {
    const UsableCpus u = t.read();
    EXPECT_EQ(u.count, affinity) << what;
    EXPECT_EQ(u.limit, CpuLimit::affinity) << what;
    EXPECT_EQ(u.cgroup, "") << what;
  };
  {
    FakeCgroups t;  // no proc_self_cgroup at all
    t.write("sys_fs_cgroup/cpu.max", "50000 100000\n");
    expect_affinity(t, "no proc_self_cgroup");
    t.write("proc_self_cgroup", "");
    expect_affinity(t, "empty proc_self_cgroup");
    for (const char* line : {"garbage\n", "0::relative/path\n", "1:memory:/x\n", "::\n"}) {
      t.write("proc_self_cgroup", line);
      expect_affinity(t, std::string("proc_self_cgroup ") + line);
    }
  }
  {
    FakeCgroups t;
    t.write("proc_self_cgroup", "0::/pod\n");
    expect_affinity(t, "no cpu.max");
    for (const char* max : {"", "\n", "garbage", "50000", "max", "50000 0", "50000 -100000",
                            "0 100000", "-50000 100000", "50000 100000 7", "5e4 100000",
                            "50000x 100000", "99999999999999999999 100000"}) {
      t.write("sys_fs_cgroup/pod/cpu.max", max);
      expect_affinity(t, std::string("cpu.max '") + max + "'");
    }
    t.remove("sys_fs_cgroup/pod/cpu.max");
    t.make_dir("sys_fs_cgroup/pod/cpu.max");  // opens, but read() fails: EISDIR
    expect_affinity(t, "cpu.max a directory");
  }
  {
    FakeCgroups t;
    t.write("proc_self_cgroup", "4:cpu,cpuacct:/c\n");
    t.write("sys_fs_cgroup/cpu,cpuacct/c/cpu.cfs_quota_us", "50000\n");
    expect_affinity(t, "no cpu.cfs_period_us");
    for (const char* period : {"", "0", "-1", "abc", "100000 100000"}) {
      t.write("sys_fs_cgroup/cpu,cpuacct/c/cpu.cfs_period_us", period);
      expect_affinity(t, std::string("cpu.cfs_period_us '") + period + "'");
    }
    t.write("sys_fs_cgroup/cpu,cpuacct/c/cpu.cfs_period_us", "100000\n");
    for (const char* quota : {"", "abc", "0", "-2", "1.5"}) {
      t.write("sys_fs_cgroup/cpu,cpuacct/c/cpu.cfs_quota_us", quota);
      expect_affinity(t, std::string("cpu.cfs_quota_us '") + quota + "'");
    }
  }
}

TEST(UsableCpus, TheCachedFigureIsTheFreshOneAndTheSameOnEveryThread) {
  Watchdog dog;
  const UsableCpus fresh = read_usable_cpus();
  EXPECT_GE(fresh.count, 1u);
  EXPECT_LE(fresh.count, fresh.affinity);
  std::vector<std::size_t> seen(8, 0);
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < seen.size(); ++i) {
      threads.emplace_back([&seen, i] { seen[i] = usable_cpus(); });
    }
  }
  for (const std::size_t n : seen) EXPECT_EQ(n, fresh.count);
  EXPECT_EQ(usable_cpus_details().count, fresh.count);
  EXPECT_EQ(usable_cpus_details().limit, fresh.limit);
}

// Runs in the child of the next test only (the variable says so), under
// taskset: one CPU usable, and the defaults sized from it.
constexpr const char* kChildVariable = "CREW_TEST_EXPECT_ONE_CPU";

TEST(UsableCpusChild, OneCpuGivesADefaultPoolTwoWorkers) {
  const char* child = std::getenv(kChildVariable);
  if (child == nullptr || std::string(child) != "1") {
    GTEST_SKIP() << "runs only under taskset, in the child of "
                    "UsableCpus.UnderTasksetADefaultPoolHasTwoWorkers";
  }
  Watchdog dog;
  EXPECT_EQ(affinity_now(), 1u);
  EXPECT_EQ(usable_cpus(), 1u);
  EXPECT_EQ(usable_cpus_details().limit, CpuLimit::affinity);
  Pool pool;
  EXPECT_EQ(pool.stats().max_workers, 2u);
  ShardedPoolOptions o;
  o.pool.max_workers = 1;
  ShardedPool sharded(o);
  EXPECT_EQ(sharded.shards(), 1u);
}

// This binary again, under `taskset -c <first CPU of ours>`, running the
// test above.
TEST(UsableCpus, UnderTasksetADefaultPoolHasTwoWorkers) {
  Watchdog dog;
  const int cpu = test::first_cpu();
  ASSERT_GE(cpu, 0);
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const std::string out =
      (fs::temp_directory_path() / ("crew-taskset-" + std::to_string(::getpid()) + ".log"))
          .string();
  std::vector<std::string> argv_s{
      "taskset",         "-c", std::to_string(cpu), self, "--gtest_filter=UsableCpusChild.*",
      "--gtest_repeat=1"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s{std::string(kChildVariable) + "=1"};
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (entry.rfind(kChildVariable, 0) != 0 && entry.rfind(kRootVariable, 0) != 0 &&
        entry.rfind("GTEST_", 0) != 0) {
      env_s.push_back(entry);
    }
  }
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, "taskset", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ASSERT_EQ(err, 0) << "taskset (util-linux) could not be started";
  dog.guard(pid);

  int status = 0;
  bool exited = false;
  const auto deadline = std::chrono::steady_clock::now() + 30s * kSlowdown;
  while (!exited && std::chrono::steady_clock::now() < deadline) {
    exited = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(5ms);
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  std::stringstream log;
  log << std::ifstream(out).rdbuf();
  std::remove(out.c_str());
  ASSERT_TRUE(exited) << "the child did not finish within 30 s:\n" << log.str();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log.str();
  // It ran, and did not skip, the one test.
  EXPECT_NE(log.str().find("[  PASSED  ] 1 test."), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("SKIPPED"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace crew

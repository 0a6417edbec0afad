// usable_cpus(): the affinity mask capped by the cgroup CPU quota
// (crew/usable_cpus.hpp).
//
// The cgroup comes from /proc/self/cgroup: the cgroup v2 line "0::/path"
// under the unified mount (/sys/fs/cgroup), and the cgroup v1 line whose
// controllers include "cpu" under /sys/fs/cgroup/cpu,cpuacct (or .../cpu).
// Both are read when both exist (a hybrid host puts the cpu controller in
// one of them) and the smaller quota wins. Each hierarchy is walked from
// the process's cgroup up to the mount's root: a parent's quota bounds its
// children, and in a container whose cgroup is mounted as the root (no
// cgroup namespace, Docker on cgroup v1) the path of /proc/self/cgroup does
// not exist under the mount, while the mount's root holds the container's
// own quota.
#include "crew/usable_cpus.hpp"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace crew {
namespace {

// CPUs in the main thread's affinity mask, whichever thread asks: a
// thread that pinned itself to one CPU does not shrink every default. A
// cpu_set_t holds 1,024 CPUs; a machine with more needs a larger set
// (EINVAL says so).
std::size_t affinity_cpus() noexcept {
  for (const pid_t pid : {::getpid(), pid_t{0}}) {
    for (std::size_t cpus = CPU_SETSIZE; cpus <= (std::size_t{1} << 20); cpus *= 2) {
      cpu_set_t* set = CPU_ALLOC(cpus);
      if (set == nullptr) break;
      const std::size_t size = CPU_ALLOC_SIZE(cpus);
      CPU_ZERO_S(size, set);
      const int rc = ::sched_getaffinity(pid, size, set);
      const int err = errno;
      const int n = rc == 0 ? CPU_COUNT_S(size, set) : 0;
      CPU_FREE(set);
      if (rc == 0) return n > 0 ? static_cast<std::size_t>(n) : 1;
      if (err != EINVAL) break;  // ESRCH: the main thread has exited; ask for this one
    }
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

// A small file's text (the first 64 KiB: cgroup files are a line or a few).
std::optional<std::string> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[4096];
  while (text.size() < 65536) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

// The whitespace-separated words of `text`.
std::vector<std::string_view> words(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t')) ++i;
    const std::size_t begin = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\n' && text[i] != '\t') ++i;
    if (i > begin) out.push_back(text.substr(begin, i - begin));
  }
  return out;
}

// A whole word as a decimal integer.
std::optional<std::int64_t> integer(std::string_view word) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
  if (ec != std::errc() || end != word.data() + word.size()) return std::nullopt;
  return v;
}

// A CPU quota: `runtime` microseconds of CPU time per `period`.
struct Quota {
  std::int64_t runtime = 0;
  std::int64_t period = 1;
  CpuLimit kind = CpuLimit::affinity;
  std::string dir;

  [[nodiscard]] double cpus() const {
    return static_cast<double>(runtime) / static_cast<double>(period);
  }
  [[nodiscard]] std::size_t whole_cpus() const {
    const auto n = static_cast<std::size_t>(runtime / period + (runtime % period != 0 ? 1 : 0));
    return n == 0 ? 1 : n;
  }
};

std::optional<Quota> make_quota(std::optional<std::int64_t> runtime,
                                std::optional<std::int64_t> period, CpuLimit kind,
                                const std::string& dir) {
  if (!runtime || !period || *runtime <= 0 || *period <= 0) return std::nullopt;
  return Quota{*runtime, *period, kind, dir};
}

// cgroup v2 cpu.max: "max 100000" (no quota) or "150000 100000".
std::optional<Quota> v2_quota(const std::string& dir) {
  const auto text = read_file(dir + "/cpu.max");
  if (!text) return std::nullopt;
  const auto w = words(*text);
  if (w.size() != 2 || w[0] == "max") return std::nullopt;
  return make_quota(integer(w[0]), integer(w[1]), CpuLimit::cgroup_v2_quota, dir);
}

// cgroup v1 cpu.cfs_quota_us (-1: no quota) over cpu.cfs_period_us.
std::optional<Quota> v1_quota(const std::string& dir) {
  const auto quota = read_file(dir + "/cpu.cfs_quota_us");
  const auto period = quota ? read_file(dir + "/cpu.cfs_period_us") : std::nullopt;
  if (!quota || !period) return std::nullopt;
  const auto q = words(*quota);
  const auto p = words(*period);
  if (q.size() != 1 || p.size() != 1) return std::nullopt;
  return make_quota(integer(q[0]), integer(p[0]), CpuLimit::cgroup_v1_quota, dir);
}

// The smaller of two quotas (by CPUs); either may be absent.
std::optional<Quota> smaller(std::optional<Quota> a, std::optional<Quota> b) {
  if (!a) return b;
  if (!b) return a;
  return b->cpus() < a->cpus() ? b : a;
}

// The smallest quota from `mount` + `path` up to `mount` itself.
template <typename Read>
std::optional<Quota> smallest_along(const std::string& mount, std::string path, Read read) {
  std::optional<Quota> best;
  while (true) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    best = smaller(best, read(mount + path));
    if (path.empty()) return best;
    path.erase(path.rfind('/'));
  }
}

// The process's cgroup paths from /proc/self/cgroup ("id:controllers:path").
struct Membership {
  std::optional<std::string> v2;
  std::optional<std::string> v1_cpu;
};

Membership membership(std::string_view text) {
  Membership m;
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    const std::size_t c1 = line.find(':');
    const std::size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, c1);
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string_view path = line.substr(c2 + 1);
    if (path.empty() || path.front() != '/') continue;
    if (id == "0" && controllers.empty()) {
      m.v2 = std::string(path);
      continue;
    }
    std::string_view rest = controllers;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      if (rest.substr(0, comma) == "cpu") m.v1_cpu = std::string(path);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
  }
  return m;
}

std::optional<Quota> cgroup_quota() {
  std::string proc_self_cgroup = "/proc/self/cgroup";
  std::string sys_fs_cgroup = "/sys/fs/cgroup";
  if (const char* root = std::getenv("CREW_TEST_CGROUP_ROOT"); root != nullptr && *root != 0) {
    proc_self_cgroup = std::string(root) + "/proc_self_cgroup";
    sys_fs_cgroup = std::string(root) + "/sys_fs_cgroup";
  }
  const auto text = read_file(proc_self_cgroup);
  if (!text) return std::nullopt;
  const Membership m = membership(*text);
  std::optional<Quota> best;
  if (m.v2) best = smallest_along(sys_fs_cgroup, *m.v2, v2_quota);
  if (m.v1_cpu) {
    for (const char* dir : {"/cpu,cpuacct", "/cpu", "/cpuacct,cpu"}) {
      const std::string mount = sys_fs_cgroup + dir;
      if (::access(mount.c_str(), F_OK) != 0) continue;
      best = smaller(best, smallest_along(mount, *m.v1_cpu, v1_quota));
      break;
    }
  }
  return best;
}

}  // namespace

std::string_view to_string(CpuLimit v) noexcept {
  switch (v) {
    case CpuLimit::affinity:
      return "affinity";
    case CpuLimit::cgroup_v2_quota:
      return "cgroup_v2_quota";
    case CpuLimit::cgroup_v1_quota:
      return "cgroup_v1_quota";
  }
  return "unknown";
}

UsableCpus read_usable_cpus() noexcept {
  UsableCpus u;
  u.affinity = affinity_cpus();
  u.count = u.affinity;
  try {
    if (const auto quota = cgroup_quota()) {
      u.quota = quota->cpus();
      u.cgroup = quota->dir;
      if (quota->whole_cpus() < u.affinity) {
        u.count = quota->whole_cpus();
        u.limit = quota->kind;
      }
    }
  } catch (...) {
    // Out of memory while reading: the affinity mask alone.
    u.count = u.affinity;
    u.limit = CpuLimit::affinity;
    u.quota = 0;
    u.cgroup.clear();
  }
  return u;
}

const UsableCpus& usable_cpus_details() noexcept {
  static const UsableCpus cached = read_usable_cpus();
  return cached;
}

std::size_t usable_cpus() noexcept { return usable_cpus_details().count; }

}  // namespace crew

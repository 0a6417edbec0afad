// tests/support/fake_cgroup.hpp: a fake cgroup tree in a scratch directory,
// for the tests of usable_cpus() (tests/base) and of the CPUs crewd sizes
// itself from (service/tests): `proc_self_cgroup` and `sys_fs_cgroup/...`
// under root(), which read_usable_cpus() reads in place of /proc/self/cgroup
// and /sys/fs/cgroup while CREW_TEST_CGROUP_ROOT names it
// (crew/usable_cpus.hpp). The destructor removes the tree.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "crew/usable_cpus.hpp"

namespace crew::test {

// The variable that points read_usable_cpus() at a fake tree.
inline constexpr const char* kCgroupRootVariable = "CREW_TEST_CGROUP_ROOT";

class FakeCgroups {
 public:
  FakeCgroups() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "crew-cgroups-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp");
    root_ = tmpl;
  }
  FakeCgroups(const FakeCgroups&) = delete;
  FakeCgroups& operator=(const FakeCgroups&) = delete;
  ~FakeCgroups() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  // Writes `text` to `relative` (its directories created).
  void write(const std::string& relative, const std::string& text) const {
    const std::filesystem::path p = root_ / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void remove(const std::string& relative) const { std::filesystem::remove_all(root_ / relative); }
  void make_dir(const std::string& relative) const {
    std::filesystem::create_directories(root_ / relative);
  }
  [[nodiscard]] std::string path(const std::string& relative) const {
    return (root_ / relative).string();
  }
  // The value for kCgroupRootVariable.
  [[nodiscard]] std::string root() const { return root_.string(); }

  // read_usable_cpus() against this tree (sets the variable for the call).
  [[nodiscard]] UsableCpus read() const {
    ::setenv(kCgroupRootVariable, root_.c_str(), 1);
    const UsableCpus u = read_usable_cpus();
    ::unsetenv(kCgroupRootVariable);
    return u;
  }

 private:
  std::filesystem::path root_;
};

}  // namespace crew::test

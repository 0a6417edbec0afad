// crew/usable_cpus.hpp: how many CPUs this process can actually use, the
// figure every default of crew is sized from (PoolOptions::max_workers,
// queue_capacity and queue_shards, the process-wide spinner limit,
// ShardedPoolOptions::shards, ParallelOptions::max_threads).
//
// std::thread::hardware_concurrency() counts the machine's CPUs: in a
// container limited to 2 CPUs on a 96-core node it says 96. usable_cpus()
// is the number of CPUs in the process's affinity mask (sched_getaffinity,
// set by taskset, cpusets, Kubernetes' static CPU manager), capped by the
// CPU bandwidth quota of its cgroup (cgroup v2 `cpu.max`, cgroup v1
// `cpu.cfs_quota_us` / `cpu.cfs_period_us`, set by `docker run --cpus`
// and Kubernetes CPU limits), rounded up: a quota of 1.5 CPUs gives 2. The
// quota taken is the smallest along the process's cgroup and its ancestors
// that the process can see, since a parent's limit applies to its children.
// The result is at least 1.
//
// Go does the same since 1.25 (GOMAXPROCS defaults to the affinity count
// capped by the cgroup quota rounded up, though never below 2 from a quota,
// and follows later changes of the limit); Java since JDK 10 with
// -XX:+UseContainerSupport (on by default; -XX:ActiveProcessorCount=N
// overrides it). crew reads the figure once: a limit changed while the
// process runs is not followed. Pools that want another size say so in
// their options.
//
// For tests only: the environment variable CREW_TEST_CGROUP_ROOT, if set,
// names a directory standing in for the system's files: its
// `proc_self_cgroup` is read instead of /proc/self/cgroup and its
// `sys_fs_cgroup` directory instead of /sys/fs/cgroup. The affinity mask
// is still the real one. Production code must not set it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace crew {

// Which limit decided usable_cpus().
enum class CpuLimit : std::uint8_t {
  affinity,         // the affinity mask: no cgroup quota, or a larger one
  cgroup_v2_quota,  // a cgroup v2 cpu.max below the affinity count
  cgroup_v1_quota,  // a cgroup v1 cpu.cfs_quota_us below the affinity count
};

[[nodiscard]] std::string_view to_string(CpuLimit v) noexcept;

// usable_cpus() and where it came from, for logs.
struct UsableCpus {
  std::size_t count = 1;                // what usable_cpus() returns, at least 1
  CpuLimit limit = CpuLimit::affinity;  // which limit gave `count`
  std::size_t affinity = 1;             // CPUs in the affinity mask
  double quota = 0;                     // the smallest cgroup quota in CPUs; 0: none
  std::string cgroup;                   // the directory of that quota's files; empty: none
};

// The CPUs this process can use (see above). Computed on the first call
// (a few small files read) and cached: later calls return the same value.
// Never blocks beyond that first read; safe from any thread, including
// concurrent first calls (one computes, the others wait for it).
[[nodiscard]] std::size_t usable_cpus() noexcept;

// The cached figure with its source, as usable_cpus().
[[nodiscard]] const UsableCpus& usable_cpus_details() noexcept;

// Reads the affinity mask and cgroup files afresh, without the cache (for
// tests and for a process that wants to see a changed limit; crew's
// defaults keep using the cached figure). Files that are missing,
// unreadable or hold something unexpected count as no limit. Safe from any
// thread.
[[nodiscard]] UsableCpus read_usable_cpus() noexcept;

}  // namespace crew

#!/usr/bin/env bash
# Installs the Debian (12, bookworm) packages crew needs, if any are missing.
#
#   scripts/deps.sh [GROUP...]     GROUP: build (default), test, bench, format, image
#
#   build   compiler, CMake, Ninja, ccache, GoogleTest/GoogleMock, hiredis, prometheus-cpp, spdlog, Boost
#   test    build + clang, lld, its sanitizer runtimes, RapidCheck (model_test),
#           redis-server (stream source tests),
#           promtool (package prometheus; metrics exposition check),
#           chromium, chromium-driver, python3-selenium (crewd's console)
#   bench   build + Google Benchmark, TBB, Boost, thread-pool, gnuplot, python3,
#           httperf and matplotlib (bench/overload: the cross-check, the plots)
#   format  clang-format
#   image   podman, runc, debootstrap (make image; a docker daemon, if one
#           answers, is used instead), python3 + PyYAML, kubectl, promtool,
#           podman-compose and CNI's dnsname plugin (make compose)
#
# Idempotent and quiet when everything is installed; runs `apt-get update`
# only when something is missing. Uses sudo when not run as root.
set -euo pipefail

readonly build_pkgs=(g++ cmake make ninja-build pkg-config ccache libgtest-dev libgmock-dev googletest
  prometheus-cpp-dev libspdlog-dev libhiredis-dev libboost-dev
  libboost-stacktrace-dev)  # the opt-in crew::stacktrace
readonly test_pkgs=("${build_pkgs[@]}" clang lld libclang-rt-14-dev prometheus redis-server
  librapidcheck-dev)
readonly bench_pkgs=("${build_pkgs[@]}" libbenchmark-dev libtbb-dev libboost-dev
  libthread-pool-dev gnuplot-nox python3 httperf python3-matplotlib)
readonly format_pkgs=(clang-format)
# The container image (make image, crewd_image_test): Debian's podman with
# runc (not crun, which refuses hybrid cgroup hosts), debootstrap for the
# debian:12 base when no registry serves it; the test reads the manifests
# (kubectl, PyYAML) and checks /metrics with promtool (prometheus). The
# local stack (make compose, crewd_compose_test): podman-compose, and the
# dnsname plugin with which podman's CNI networks resolve service names.
readonly image_pkgs=(podman runc debootstrap python3 python3-yaml prometheus podman-compose
  golang-github-containernetworking-plugin-dnsname)
# crewd (service/): its libraries for every build (Boost.Asio and Beast are
# header-only in libboost-dev, which also gives crew::asio); for its tests
# the Prometheus server and promtool, and PyYAML for the deploy/ manifest
# check; wrk for its throughput figures. kubectl (Debian: kubernetes-client)
# renders the manifests; one installed from elsewhere is used as it is.
readonly service_pkgs=(libboost-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  libspdlog-dev prometheus-cpp-dev)
readonly service_test_pkgs=(prometheus python3 python3-yaml)
# The console's browser tests (service/tests/crewd_console_test.py):
# headless chromium driven by chromedriver through Selenium.
readonly console_test_pkgs=(chromium chromium-driver python3-selenium)

usage() { sed -n '2,16s/^# \{0,1\}//p' "$0"; }

wanted=()
for group in "${@:-build}"; do
  case "$group" in
    build) wanted+=("${build_pkgs[@]}" "${service_pkgs[@]}") ;;
    test) wanted+=("${test_pkgs[@]}" "${service_pkgs[@]}" "${service_test_pkgs[@]}"
      "${console_test_pkgs[@]}") ;;
    bench) wanted+=("${bench_pkgs[@]}" "${service_pkgs[@]}" wrk) ;;
    format) wanted+=("${format_pkgs[@]}") ;;
    image) wanted+=("${image_pkgs[@]}") ;;
    -h | --help) usage; exit 0 ;;
    *) echo "deps.sh: unknown group '$group'" >&2; usage >&2; exit 2 ;;
  esac
done

if [[ " ${*:-build} " =~ " "(test|image)" " ]] && ! command -v kubectl >/dev/null; then
  wanted+=(kubernetes-client)
fi

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "deps.sh: not a Debian system; install these yourself: ${wanted[*]}" >&2
  exit 0
fi

# One dpkg-query for all packages; unknown ones print nothing (and an error).
mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | sort -u)
installed=" $({ dpkg-query -W -f='${Package}=${Status}\n' "${wanted[@]}" 2>/dev/null || true; } |
  sed -n 's/=install ok installed$//p' | tr '\n' ' ') "
missing=()
for pkg in "${wanted[@]}"; do
  [[ "$installed" == *" $pkg "* ]] || missing+=("$pkg")
done
((${#missing[@]} == 0)) && exit 0

if ((EUID == 0)); then
  as_root=()
elif command -v sudo >/dev/null; then
  # No terminal (CI): fail at once instead of waiting for a password.
  if [[ -t 0 ]]; then as_root=(sudo); else as_root=(sudo -n); fi
else
  echo "deps.sh: missing ${missing[*]}; run this script as root to install them" >&2
  exit 1
fi

# Retries for a flaky mirror; waits for a dpkg lock held by another apt.
apt_get() {
  local try
  for try in 1 2 3; do
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get -qq -o=Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300 "$@" && return 0
    echo "deps.sh: apt-get $1 failed (try $try of 3)" >&2
    sleep $((try * 5))
  done
  return 1
}

echo "deps.sh: installing ${missing[*]}"
apt_get update
apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null
echo "deps.sh: done"

#!/usr/bin/env bash
# Configures a CMake preset (CMakePresets.json), first clearing a build
# directory that another generator made: the presets build with Ninja, and
# CMake refuses to switch generators in place. Only the cache goes (the
# CMakeCache.txt and CMakeFiles/); compilations come back from ccache.
#
#   scripts/configure.sh PRESET [cmake arguments...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset="${1:?usage: scripts/configure.sh PRESET [cmake arguments...]}"
shift
case "$preset" in
  default | bench) dir=build ;;
  tsan | asan | clang) dir="build-$preset" ;;
  *) dir="" ;;
esac
cache="$dir/CMakeCache.txt"
if [[ -n "$dir" && -f "$cache" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$cache"; then
  echo "configure.sh: $dir was made by another generator; clearing its cache"
  rm -rf "$cache" "$dir/CMakeFiles"
fi
exec cmake --preset "$preset" "$@"

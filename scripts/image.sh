#!/usr/bin/env bash
# Builds crewd's container image from deploy/Dockerfile (`make image`):
#
#   scripts/image.sh [TAG]      TAG: crewd:0.1.0 unless given (or $CREWD_IMAGE)
#   scripts/image.sh --file DOCKERFILE --context DIR TAG
#                               another image on the same base (deploy/compose's
#                               Redis and Prometheus, scripts/compose.sh)
#
# The engine is scripts/container.sh's (docker with a daemon, else podman).
# The Dockerfile starts from debian:12; when no local image has that name and
# no registry serves it, it is made here: debootstrap --variant=minbase of
# bookworm from the Debian mirror apt on this machine uses, imported as
# debian:12. The build keeps the engine's layer cache, so a second run with
# nothing changed compiles nothing; its output goes to build-image/build.log
# (build-<name>.log for <name>.Dockerfile) and is shown only on failure.
# DOCKERFILE.dockerignore, when there is one, is the context's ignore file.
# Prints one line when the image changed, nothing otherwise.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
file=deploy/Dockerfile
context=.
while [[ "${1:-}" == --file || "${1:-}" == --context ]]; do
  [[ $# -ge 2 ]] || { echo "image.sh: $1 needs a value" >&2; exit 2; }
  if [[ "$1" == --file ]]; then file="$2"; else context="$2"; fi
  shift 2
done
tag="${1:-${CREWD_IMAGE:-crewd:0.1.0}}"
log=build.log
[[ "$file" == deploy/Dockerfile ]] || log="build-$(basename "$file" .Dockerfile).log"
engine() { bash scripts/container.sh "$@"; }
state=build-image
mkdir -p "$state"

# The first bookworm (not -updates / -security) mirror in apt's sources,
# one-line (*.list) or deb822 (*.sources) format.
debian_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r "$f" ]] || continue
    awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) while ($i !~ /\]$/) i++; if ($i ~ /^\[/ || $i ~ /\]$/) i++;
                       if ($(i + 1) == "bookworm") { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r "$f" ]] || continue
    # Paragraphs separated by blank lines; URIs and Suites may list several.
    awk 'BEGIN { RS = ""; FS = "\n" }
         { types = uris = suites = ""
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^Types:/) types = $i; if ($i ~ /^URIs:/) uris = $i; if ($i ~ /^Suites:/) suites = $i }
           if (types ~ /[ \t]deb([ \t]|$)/ && suites ~ /[ \t]bookworm([ \t]|$)/) {
             split(uris, u, /[ \t]+/); print u[2]; exit } }' "$f"
  done
}

base_image() {
  engine image inspect debian:12 >/dev/null 2>&1 && return 0
  # The engine's own registries, when this machine reaches one (bounded: a
  # closed network fails at once, a slow one must not hang the build).
  timeout 120 bash scripts/container.sh pull debian:12 >"$state/pull.log" 2>&1 && return 0
  local mirror
  mirror="$(debian_mirror | head -n 1)"
  if [[ -z "$mirror" ]]; then
    echo "image.sh: no bookworm mirror in /etc/apt/sources.list*; cannot make debian:12" >&2
    return 1
  fi
  command -v debootstrap >/dev/null || {
    echo "image.sh: debootstrap missing (scripts/deps.sh image)" >&2
    return 1
  }
  echo "image.sh: making debian:12 with debootstrap from $mirror"
  local rootfs
  rootfs="$(mktemp -d "$root/$state/rootfs.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" EXIT
  if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$state/debootstrap.log" 2>&1; then
    tail -n 20 "$state/debootstrap.log" >&2
    return 1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  if ! tar -C "$rootfs" -c . | engine import - debian:12 >"$state/import.log" 2>&1; then
    cat "$state/import.log" >&2
    return 1
  fi
  rm -rf "$rootfs"
  trap - EXIT
}

base_image

before="$(engine image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
start=$SECONDS
# docker reads DOCKERFILE.dockerignore by itself; podman is told.
ignore=()
[[ "$(engine --which)" == podman && -f "$file.dockerignore" ]] && ignore=(--ignorefile "$file.dockerignore")
# The Dockerfile's compiler cache is a RUN --mount cache, which docker's
# classic builder does not know (podman's buildah does).
[[ "$(engine --which)" == docker ]] && export DOCKER_BUILDKIT=1
if ! engine build --network=host -f "$file" "${ignore[@]}" -t "$tag" "$context" >"$state/$log" 2>&1; then
  tail -n 40 "$state/$log" >&2
  echo "image.sh: build of $tag failed (whole log: $state/$log)" >&2
  exit 1
fi
after="$(engine image inspect --format '{{.Id}}' "$tag")"
if [[ "$after" != "$before" ]]; then
  size="$(engine image inspect --format '{{.Size}}' "$tag")"
  echo "image.sh: $tag ${after:0:12}, $((size / 1000000)) MB, built in $((SECONDS - start)) s"
fi

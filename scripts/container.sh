#!/usr/bin/env bash
# Runs a container engine command with whatever engine this machine has:
#
#   scripts/container.sh ARGS...     e.g. scripts/container.sh images
#   scripts/container.sh --which     prints the engine: docker or podman
#
# docker when its daemon answers; otherwise Debian's podman, with runc
# (crun refuses hosts with hybrid cgroups) and deploy/podman/containers.conf
# through CONTAINERS_CONF (no default ulimits; nothing written to /etc).
# Exit 125 when neither can run (scripts/deps.sh image installs podman).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

engine=""
if command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then
  engine=docker
elif command -v podman >/dev/null && command -v runc >/dev/null; then
  engine=podman
fi

if [[ "${1:-}" == "--which" ]]; then
  [[ -n "$engine" ]] || { echo "container.sh: neither a docker daemon nor podman with runc" >&2; exit 125; }
  echo "$engine"
  exit 0
fi

case "$engine" in
  docker) exec docker "$@" ;;
  podman) CONTAINERS_CONF="${CONTAINERS_CONF:-$root/deploy/podman/containers.conf}" \
    exec podman --runtime runc "$@" ;;
  *)
    echo "container.sh: no container engine: no docker daemon answers, and podman or runc" \
      "is missing (scripts/deps.sh image installs them)" >&2
    exit 125
    ;;
esac

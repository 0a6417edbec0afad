#!/usr/bin/env bash
# The local stack of deploy/compose/compose.yaml: two crewd instances sharing
# jobs through Redis, and Prometheus scraping both (`make compose`):
#
#   scripts/compose.sh up       builds the images (quiet when nothing changed),
#                               (re)starts the stack detached, waits until both
#                               crewd instances are ready and Prometheus
#                               answers, and prints their addresses
#   scripts/compose.sh down     stops the stack (crewd drains) and removes its
#                               containers and network
#   scripts/compose.sh ARGS...  any other compose command: ps, logs crewd-a,
#                               exec crewd-a crewctl --redis redis:6379 status
#   scripts/compose.sh --tool   prints the compose command it runs
#
# COMPOSE_PROJECT_NAME names the stack (default crew), so that several can
# run side by side; CREWD_A_PORT, CREWD_B_PORT, PROMETHEUS_PORT and
# REDIS_PORT move its ports on 127.0.0.1 (8081, 8082, 9090, 6379).
# The compose tool goes with scripts/container.sh's engine: `docker compose`
# (or docker-compose) with a docker daemon, else Debian's podman-compose
# (scripts/deps.sh image) with the same podman settings. The compose tool's
# output goes to build-image/compose-<project>.log and is shown on failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
project="${COMPOSE_PROJECT_NAME:-crew}"
file=deploy/compose/compose.yaml
log="build-image/compose-$project.log"
engine() { bash scripts/container.sh "$@"; }

which_engine="$(engine --which)"
case "$which_engine" in
  docker)
    if docker compose version >/dev/null 2>&1; then
      tool=(docker compose)
    elif command -v docker-compose >/dev/null; then
      tool=(docker-compose)
    else
      echo "compose.sh: a docker daemon answers but neither \`docker compose\` nor docker-compose" \
        "is installed" >&2
      exit 125
    fi
    ;;
  podman)
    command -v podman-compose >/dev/null || {
      echo "compose.sh: podman-compose missing (scripts/deps.sh image)" >&2
      exit 125
    }
    # container.sh's settings; runc comes from containers.conf's [engine],
    # as podman-compose runs podman itself.
    export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/deploy/podman/containers.conf}"
    tool=(podman-compose)
    # The services find each other by name: with podman's CNI networking
    # that takes the dnsname plugin (netavark has it built in).
    if [[ "$(engine info --format '{{.Host.NetworkBackend}}')" == cni ]] &&
      ! [[ -x /usr/lib/cni/dnsname || -x /usr/libexec/cni/dnsname || -x /opt/cni/bin/dnsname ]]; then
      echo "compose.sh: podman's CNI networks have no name resolution without the dnsname" \
        "plugin (Debian: golang-github-containernetworking-plugin-dnsname, scripts/deps.sh image)" >&2
      exit 125
    fi
    ;;
esac
compose() { "${tool[@]}" -p "$project" -f "$file" "$@"; }

# The project's containers and networks, by the label both tools set.
label="com.docker.compose.project=$project"
containers() { engine ps -a -q --filter "label=$label"; }
networks() { engine network ls -q --filter "label=$label"; }

# `engine ARGS... ID...` on the ids that LIST (containers, networks) prints,
# if there are any; output to the log, failures left to the final check.
on_each() {
  local list="$1" ids
  shift
  mapfile -t ids < <("$list")
  ((${#ids[@]} == 0)) || engine "$@" "${ids[@]}" >>"$log" 2>&1 || true
}

down() {
  # crewd drains on SIGTERM (shutdown.timeout_ms 10 s); podman-compose's own
  # down would give every container 1 s.
  on_each containers stop -t 15
  compose down >>"$log" 2>&1 || true
  on_each containers rm -f
  # podman-compose 1.0.3 leaves the network it made.
  on_each networks network rm
  if [[ -n "$(containers)$(networks)" ]]; then
    echo "compose.sh: $project left containers or networks behind (see $log)" >&2
    return 1
  fi
}

# "200" when GET http://127.0.0.1:PORT/PATH answers 200, else nothing.
status_200() {
  # shellcheck disable=SC2016  # $1 and $2 are the inner shell's
  timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
    printf "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n" "$2" >&3 && head -n 1 <&3' _ "$1" "$2" \
    2>/dev/null | grep -o ' 200 ' || true
}

up() {
  mkdir -p build-image
  : >"$log"
  bash scripts/image.sh
  bash scripts/image.sh --file deploy/compose/redis.Dockerfile --context deploy/compose \
    crew-redis:bookworm
  bash scripts/image.sh --file deploy/compose/prometheus.Dockerfile --context deploy/compose \
    crew-prometheus:bookworm
  # Prometheus mounts the rules folder, which a bind mount needs to exist.
  mkdir -p deploy/monitoring/rules
  [[ -z "$(containers)$(networks)" ]] || down
  if ! compose up -d >>"$log" 2>&1 || [[ -z "$(containers)" ]]; then
    tail -n 30 "$log" >&2
    echo "compose.sh: up failed (whole log: $log)" >&2
    return 1
  fi
  local a="${CREWD_A_PORT:-8081}" b="${CREWD_B_PORT:-8082}" p="${PROMETHEUS_PORT:-9090}"
  local deadline=$((SECONDS + 60))
  until [[ -n "$(status_200 "$a" /readyz)" && -n "$(status_200 "$b" /readyz)" &&
    -n "$(status_200 "$p" /-/ready)" ]]; do
    if ((SECONDS > deadline)); then
      engine ps -a --filter "label=$label" >&2
      echo "compose.sh: the stack is not ready 60 s after up (logs: scripts/compose.sh logs" \
        "crewd-a; compose output: $log)" >&2
      return 1
    fi
    sleep 0.5
  done
  cat <<EOF
compose.sh: stack "$project" is up ($which_engine):
  crewd-a     http://127.0.0.1:$a   (/readyz, /metrics, POST /api/v1/jobs)
  crewd-b     http://127.0.0.1:$b
  prometheus  http://127.0.0.1:$p   (targets: /targets, rules: /rules)
  redis       127.0.0.1:${REDIS_PORT:-6379}
  jobs:  scripts/compose.sh exec crewd-a crewctl --redis redis:6379 enqueue --kind sleep --ms 200 --count 50
  stop:  make compose-down
EOF
}

case "${1:-}" in
  --tool) echo "${tool[*]}" ;;
  up) up ;;
  down) mkdir -p build-image && : >"$log" && down ;;
  "") sed -n '2,21s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  *) compose "$@" ;;
esac

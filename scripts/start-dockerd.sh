#!/usr/bin/env bash
# Starts the Docker engine (Debian's docker.io, installed by scripts/deps.sh) for the
# container backend's engine tests, if it is not already running. Idempotent; installs
# nothing. Registers gVisor's runsc as a runtime when it is installed.
#
# It cannot break other tests: it only starts a daemon in the background (logging to
# target/dockerd.log), waits for its socket, and exits non-zero with the log's tail when
# the engine does not come up, so the engine tests fail loudly instead of passing.
set -euo pipefail
cd "$(dirname "$0")/.."

sock=/var/run/docker.sock
docker_cli() {
  # Debian's client matches Debian's dockerd; any client negotiates the API version down.
  if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else docker "$@"; fi
}

if [ -S "$sock" ] && docker_cli version >/dev/null 2>&1; then
  echo "dockerd: already running"
  exit 0
fi
if ! command -v dockerd >/dev/null; then
  echo "dockerd: not installed (scripts/deps.sh installs docker.io)" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "dockerd: needs root to start; start it yourself or run as root" >&2
  exit 1
fi

mkdir -p target
log="$(pwd)/target/dockerd.log"
# Strata's engine containers never use the engine's networking (--network none), so the
# daemon creates no bridge and leaves the host's iptables alone: other tests see the host's
# network unchanged.
args=(--host "unix://$sock" --userland-proxy=false --bridge=none --iptables=false --ip-masq=false)
if command -v runsc >/dev/null; then
  # gVisor as an extra runtime. Strata runs engine containers without a network
  # (--network none); runsc's own netstack is switched off to match.
  conf="$(pwd)/target/dockerd.json"
  printf '{"runtimes":{"runsc":{"path":"%s","runtimeArgs":["--network=none"]}}}\n' \
    "$(command -v runsc)" > "$conf"
  args+=(--config-file "$conf")
fi
# A stale socket or pid file from a killed daemon would make dockerd refuse to start.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
  rm -f /var/run/docker.pid
fi
[ -S "$sock" ] && rm -f "$sock"
echo "dockerd: starting (log: $log)"
setsid nohup dockerd "${args[@]}" >"$log" 2>&1 < /dev/null &

for _ in $(seq 1 120); do
  if [ -S "$sock" ] && docker_cli version >/dev/null 2>&1; then
    echo "dockerd: ready ($(docker_cli version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  sleep 0.5
done
echo "dockerd: did not come up within 60 s; last log lines:" >&2
tail -20 "$log" >&2 || true
exit 1

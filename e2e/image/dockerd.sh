#!/usr/bin/env bash
# Make a Docker engine answer on the default socket, for the image tests (tests/image).
#
# Why a script: these machines have no init system, so the `docker.io` package's service does
# not start; dockerd is started here as root, in the background, with no bridge network and no
# iptables rules (builds and containers use the host network, everything stays on 127.0.0.1).
# Its data root is under the cache dir, so built images (the stand-in base, the layer cache)
# survive between runs. An engine that already answers is used as it is.
#
# Environment: ANARCHON_CACHE (default $HOME/.cache/anarchon).
# Exit codes: 0 the engine answers, 1 it did not start (its log is printed), 2 not root / no dockerd.
set -euo pipefail

docker_cli=/usr/bin/docker  # Debian's 20.10 CLI: it drives BuildKit without the buildx plugin
if "$docker_cli" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  echo "dockerd.sh: a Docker engine answers ($("$docker_cli" version --format '{{.Server.Version}}'))"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v dockerd >/dev/null; then
  echo "dockerd.sh: no Docker engine answers, and dockerd cannot be started here (needs root and Debian's docker.io)" >&2
  exit 2
fi
state="${ANARCHON_CACHE:-$HOME/.cache/anarchon}/docker"
mkdir -p "$state"
setsid dockerd --data-root "$state/data" --bridge=none --iptables=false --ip-masq=false \
  --log-level=warn >>"$state/dockerd.log" 2>&1 </dev/null &
for _ in $(seq 1 60); do
  if "$docker_cli" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    echo "dockerd.sh: dockerd started (pid $!, data root $state/data, log $state/dockerd.log)"
    exit 0
  fi
  sleep 1
done
echo "dockerd.sh: dockerd did not answer within 60 s; its log:" >&2
tail -30 "$state/dockerd.log" >&2
exit 1

#!/usr/bin/env bash
# Build toxiproxy-server (TCP fault injection in front of the test stores, see
# tests/faults/toxiproxy.py) into a cache directory outside the repository, from
# the Go module proxy only.
#
# Why not in build.sh: build.sh's cache key is a hash of itself, so adding a tool
# there would throw away a control plane that takes ~20-30 min to build. This one
# takes seconds and is keyed by its own version only.
#
# Usage:
#   bash e2e/controlplane/build-toxiproxy.sh                  build if missing, print bin dir
#   bash e2e/controlplane/build-toxiproxy.sh --print-bin-dir  print the bin dir, build nothing
#
# Environment: ANARCHON_CACHE (default $HOME/.cache/anarchon).
# Exit codes: 0 ok, 1 build failed, 2 `go` not installed.
set -euo pipefail

# `go list -m -versions` shows only old tags for this module; newer ones are served
# all the same: go list -m github.com/Shopify/toxiproxy/v2@v2.12.0
TOXIPROXY_VERSION="v2.12.0"

cache_root="${ANARCHON_CACHE:-$HOME/.cache/anarchon}"
bin_dir="$cache_root/toxiproxy/${TOXIPROXY_VERSION}/bin"

if [ "${1:-}" = "--print-bin-dir" ]; then
  echo "$bin_dir"
  exit 0
fi

if [ -x "$bin_dir/toxiproxy-server" ]; then
  echo "build-toxiproxy.sh: toxiproxy-server ${TOXIPROXY_VERSION} present in $bin_dir"
  echo "$bin_dir"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
build-toxiproxy.sh: ERROR: the Go toolchain ('go') is not installed or not on PATH.
  toxiproxy-server ${TOXIPROXY_VERSION} is built from the Go module proxy.
  Install Go, then run: bash e2e/controlplane/build-toxiproxy.sh
MSG
  exit 2
fi

start=$(date +%s)
mkdir -p "$bin_dir"
tmp="$(mktemp -d "$bin_dir/../tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false" GOTOOLCHAIN=local
# The module's own version variable, so that `toxiproxy-server -version` and /version are honest.
ldflags="-s -w -X github.com/Shopify/toxiproxy/v2.Version=${TOXIPROXY_VERSION#v}"
GOBIN="$tmp" go install -trimpath -ldflags="$ldflags" "github.com/Shopify/toxiproxy/v2/cmd/server@${TOXIPROXY_VERSION}"
mv -f "$tmp/server" "$bin_dir/toxiproxy-server"
echo "build-toxiproxy.sh: toxiproxy-server ${TOXIPROXY_VERSION} built in $(( $(date +%s) - start ))s"
echo "$bin_dir"

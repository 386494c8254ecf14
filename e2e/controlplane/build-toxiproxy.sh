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

source "$(dirname "${BASH_SOURCE[0]}")/gotool.sh"
gotool_cached toxiproxy-server "$bin_dir" "${1:-}"
build() {
  # The module's own version variable, so that `toxiproxy-server -version` and /version are honest.
  local ldflags="-s -w -X github.com/Shopify/toxiproxy/v2.Version=${TOXIPROXY_VERSION#v}"
  GOBIN="$tmp" GOFLAGS=-buildvcs=false go install -trimpath -ldflags="$ldflags" \
    "github.com/Shopify/toxiproxy/v2/cmd/server@${TOXIPROXY_VERSION}"
  mv "$tmp/server" "$tmp/toxiproxy-server"
}
gotool_build toxiproxy-server "$bin_dir" build

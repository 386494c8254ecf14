#!/usr/bin/env bash
# Build promcheck (e2e/promcheck: `promtool check rules` from Prometheus' own packages, plus the
# metric names of each expression) into a cache directory outside the repository, from the Go
# module proxy only. The chart tests check the PrometheusRule and the Grafana dashboard with it.
#
# Why not in build.sh: build.sh's cache key is a hash of itself, so adding a tool there would
# throw away a control plane that takes ~20-30 min to build. This one is keyed by its own sources
# (a cold build takes a few minutes on 2 cores: it compiles Prometheus' PromQL packages).
#
# Usage:
#   bash e2e/controlplane/build-promcheck.sh                  build if missing, print bin dir
#   bash e2e/controlplane/build-promcheck.sh --print-bin-dir  print the bin dir, build nothing
#
# Environment: ANARCHON_CACHE (default $HOME/.cache/anarchon).
# Exit codes: 0 ok, 1 build failed, 2 `go` not installed.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../promcheck" && pwd)"
key="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-12)"
cache_root="${ANARCHON_CACHE:-$HOME/.cache/anarchon}"
bin_dir="$cache_root/promcheck/${key}/bin"

source "$(dirname "${BASH_SOURCE[0]}")/gotool.sh"
gotool_cached promcheck "$bin_dir" "${1:-}"
build() { cd "$src" && go build -trimpath -ldflags="-s -w" -o "$tmp/promcheck" .; }
gotool_build promcheck "$bin_dir" build

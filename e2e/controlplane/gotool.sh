# Sourced by the build-<tool>.sh scripts: what every small Go tool of the tests has in common.
#
#   gotool_cached NAME BIN_DIR [--print-bin-dir]   exit 0 printing BIN_DIR if NAME is built (or asked
#                                                  only for the dir); return otherwise
#   gotool_build NAME BIN_DIR COMMAND...           run COMMAND (it writes $tmp/NAME) with Go's
#                                                  reproducible-build settings, then install it
#
# A tool is built from the Go module proxy only, into a cache outside the repository
# (ANARCHON_CACHE, default $HOME/.cache/anarchon), keyed by what the calling script says.
# Exit codes: 0 ok, 1 build failed, 2 `go` not installed.

gotool_cached() {
  local name=$1 bin_dir=$2
  if [ "${3:-}" = "--print-bin-dir" ]; then
    echo "$bin_dir"
    exit 0
  fi
  if [ -x "$bin_dir/$name" ]; then
    echo "$(basename "$0"): $name present in $bin_dir"
    echo "$bin_dir"
    exit 0
  fi
  if ! command -v go >/dev/null 2>&1; then
    cat >&2 <<MSG
$(basename "$0"): ERROR: the Go toolchain ('go') is not installed or not on PATH.
  $name is built from the Go module proxy.
  Install Go, then run: bash e2e/controlplane/$(basename "$0")
MSG
    exit 2
  fi
}

gotool_build() {
  local name=$1 bin_dir=$2 start
  shift 2
  start=$(date +%s)
  mkdir -p "$bin_dir"
  tmp="$(mktemp -d "$bin_dir/../tmp.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  (export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" GOTOOLCHAIN=local && "$@")
  mv -f "$tmp/$name" "$bin_dir/$name"
  echo "$(basename "$0"): $name built in $(( $(date +%s) - start ))s"
  echo "$bin_dir"
}

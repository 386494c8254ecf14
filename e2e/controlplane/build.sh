#!/usr/bin/env bash
# Build the test control plane binaries (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok) plus helm and kubeconform into
# a cache directory outside the repository, from the Go module proxy only.
#
# Why a cache keyed by a hash: a cold build of kube-apiserver takes many minutes
# on 2 cores, so binaries are reused as long as the versions (go.mod, go.sum,
# this script) are unchanged; a warm run only checks that files exist.
#
# Usage:
#   bash e2e/controlplane/build.sh               build what is missing, print bin dir
#   bash e2e/controlplane/build.sh --print-bin-dir   print the bin dir, build nothing
#
# Environment: ANARCHON_CACHE (default $HOME/.cache/anarchon).
# Exit codes: 0 ok, 1 build failed, 2 `go` not installed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Versions of the commands built with `go install pkg@version` (their go.mod has
# no replace directives). The Kubernetes and etcd versions come from go.mod.
KWOK_VERSION="v0.7.0"
HELM_VERSION="v3.22.0"
KUBECONFORM_VERSION="v0.7.0"

k8s_version="$(sed -nE 's#^[[:space:]]*k8s\.io/kubernetes[[:space:]]+(v[^[:space:]]+).*#\1#p' "$here/go.mod" | head -1)"
etcd_version="$(sed -nE 's#^[[:space:]]*go\.etcd\.io/etcd/server/v3[[:space:]]+(v[^[:space:]]+).*#\1#p' "$here/go.mod" | head -1)"
key="$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)"
cache_root="${ANARCHON_CACHE:-$HOME/.cache/anarchon}"
out_dir="$cache_root/controlplane/${k8s_version}-${key}"
bin_dir="$out_dir/bin"

if [ "${1:-}" = "--print-bin-dir" ]; then
  echo "$bin_dir"
  exit 0
fi

start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

# binary name -> how it is built, in build order: the control plane first so it
# is usable while helm/kubeconform (needed by another suite) still build.
control_plane=(etcd kube-apiserver kube-controller-manager kube-scheduler)
# kubelet: the optional real node (realnode.py), for the tests that need real containers.
all=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok helm kubeconform kubelet)

missing=()
for b in "${all[@]}"; do
  [ -x "$bin_dir/$b" ] || missing+=("$b")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "build.sh: all binaries present in $bin_dir (k8s ${k8s_version}, etcd ${etcd_version}, kwok ${KWOK_VERSION}); took $(elapsed)s"
  echo "$bin_dir"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
build.sh: ERROR: the Go toolchain ('go') is not installed or not on PATH.
  The test control plane (kube-apiserver ${k8s_version}, etcd, kwok) is built from
  Go modules and needs Go >= 1.24. Install Go, then run: bash e2e/controlplane/build.sh
  Missing binaries: ${missing[*]} (in $bin_dir)
MSG
  exit 2
fi

mkdir -p "$bin_dir"
tmp="$(mktemp -d "$out_dir/tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local
ldflags="-s -w"
echo "build.sh: building ${missing[*]} into $bin_dir (k8s ${k8s_version}, etcd ${etcd_version}, kwok ${KWOK_VERSION}, helm ${HELM_VERSION}, kubeconform ${KUBECONFORM_VERSION}; $(go version))"

need() { # need NAME... : true if any NAME is missing
  for n in "$@"; do [ -x "$bin_dir/$n" ] || return 0; done
  return 1
}
install_bin() { # move built binaries into place atomically
  for n in "$@"; do mv -f "$tmp/$n" "$bin_dir/$n"; done
}

# Version ldflags so that `kube-apiserver --version`, /version and the kubelet's node info are honest.
kv="k8s.io/component-base/version"
k8s_ldflags="$ldflags -X $kv.gitVersion=${k8s_version} -X $kv.gitMajor=1 -X $kv.gitMinor=$(echo "$k8s_version" | cut -d. -f2) -X $kv.gitTreeState=clean"
k8s_ldflags="$k8s_ldflags -X k8s.io/client-go/pkg/version.gitVersion=${k8s_version}"
if need "${control_plane[@]}"; then
  # One `go build` for all four shares the compile of common packages.
  (cd "$here" && go build -trimpath -ldflags="$k8s_ldflags" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler)
  (cd "$here" && go build -trimpath -ldflags="$ldflags" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
  install_bin kube-apiserver kube-controller-manager kube-scheduler etcd
  echo "build.sh: control plane built after $(elapsed)s"
fi

gi() { # gi NAME PKG@VERSION : go install into tmp, then into bin dir
  GOBIN="$tmp" GOFLAGS="-buildvcs=false" go install -trimpath -ldflags="$ldflags" "$2"
  install_bin "$1"
  echo "build.sh: $1 built after $(elapsed)s"
}
if need kubelet; then
  (cd "$here" && go build -trimpath -ldflags="$k8s_ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kubelet)
  install_bin kubelet
  echo "build.sh: kubelet built after $(elapsed)s"
fi
need kwok && gi kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
need helm && gi helm "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
need kubeconform && gi kubeconform "github.com/yannh/kubeconform/cmd/kubeconform@${KUBECONFORM_VERSION}"

echo "build.sh: done in $(elapsed)s"
echo "$bin_dir"

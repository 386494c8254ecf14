#!/usr/bin/env bash
# Build a stand-in for the Dockerfile's base image (python:3.11-slim) from Debian's packages, for
# machines where no container registry answers; print its name.
#
# What stands in: Debian bookworm (minbase) with its python3 3.11, venv and pip, imported into
# Docker as STANDIN_IMAGE below. It is not the official image: Python lives in /usr/bin rather
# than /usr/local, and the image is larger. Use it only as `--build-arg BASE=$(bash standin-base.sh)`.
#
# Why a cache: debootstrap takes ~80 s; its tree is kept as a tarball under the cache dir, keyed by
# this script, so a later run (or a new Docker data root) only re-imports it.
# The Debian mirror is the one apt already uses here (read from apt's sources, not written in the repo).
#
# Environment: ANARCHON_CACHE (default $HOME/.cache/anarchon).
set -euo pipefail

STANDIN_IMAGE="anarchon-standin/python:3.11-slim-bookworm"
docker_cli=/usr/bin/docker
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
key="$(sha256sum "$here/standin-base.sh" | cut -c1-12)"
cache="${ANARCHON_CACHE:-$HOME/.cache/anarchon}/image"
tarball="$cache/standin-rootfs-$key.tar"
tag="$STANDIN_IMAGE-$key"

if "$docker_cli" image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"
  exit 0
fi
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
  command -v debootstrap >/dev/null || { echo "standin-base.sh: debootstrap is not installed" >&2; exit 2; }
  mirror="$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' 2>/dev/null \
    | grep -v -- '-security' | grep -m1 '/debian/\?$' || true)"
  [ -n "$mirror" ] || { echo "standin-base.sh: no Debian mirror found in apt's sources" >&2; exit 2; }
  root="$(mktemp -d "$cache/rootfs.XXXXXX")"
  trap 'rm -rf "$root"' EXIT
  echo "standin-base.sh: debootstrap bookworm from apt's mirror into $root" >&2
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
    bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  # What the image does not need: apt's lists and caches, docs, locales beyond C.UTF-8.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
  tar -C "$root" --numeric-owner -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi
# An imported image has an empty config: give it the PATH and LANG the official image has.
"$docker_cli" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  "$tarball" "$tag" >/dev/null
echo "$tag"

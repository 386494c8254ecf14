#!/usr/bin/env bash
# The test command (README: "Run the tests"); .ci/run calls it too.
#
# On a fresh machine it installs what the tests need, then runs everything against real
# servers: Redis, PostgreSQL, NATS and RabbitMQ from Debian's packages (the tests start
# their own private instances on loopback), and a Kubernetes control plane built from the
# Go module proxy (cached outside the repo; the first build takes ~20-30 min on 2 cores).
#
#   bash tests/run.sh                 # lint, type-check, all tests
#   bash tests/run.sh tests/engine    # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$(date +%s)
say() { printf '\n== %s (%ss)\n' "$*" "$(( $(date +%s) - t0 ))"; }

say "system packages"
need=()
command -v redis-server >/dev/null || need+=(redis-server)
[ -x /usr/lib/postgresql/15/bin/postgres ] || command -v pg_ctlcluster >/dev/null || need+=(postgresql)
command -v nats-server >/dev/null || need+=(nats-server)
command -v rabbitmq-server >/dev/null || need+=(rabbitmq-server)
command -v openssl >/dev/null || need+=(openssl)
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v dockerd >/dev/null || need+=(docker.io)          # the image tests (tests/image)
command -v debootstrap >/dev/null || need+=(debootstrap)    # their stand-in base image
command -v chromium >/dev/null || need+=(chromium)          # anarchon ui in a real browser (tests/ui)
command -v chromedriver >/dev/null || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

say "python packages"
python3 -m pip install -q --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v "Running pip as the 'root' user" || true

say "control plane binaries"
if ! command -v go >/dev/null; then
  echo "Go is needed to build the test control plane (kube-apiserver, KWOK) from the Go module proxy." >&2
  echo "Install Go 1.22+ and run this again." >&2
  exit 2
fi
bash e2e/controlplane/build.sh
bash e2e/controlplane/build-toxiproxy.sh  # TCP faults in front of the stores (tests/faults)
bash e2e/controlplane/build-promcheck.sh   # promtool checks of the chart's alert rules and dashboard (tests/chart)

say "docker engine and the image's stand-in base"
# tests/image builds the Dockerfile on a stand-in for python:3.11-slim made from Debian's packages
# (no registry answers here; ~80 s to several minutes cold, cached under ~/.cache/anarchon). Without
# an engine the image tests fail in CI (CI=true) and say why.
if bash e2e/image/dockerd.sh; then
  bash e2e/image/standin-base.sh
else
  echo "no Docker engine: tests/image will fail in CI (CI=true) or be skipped elsewhere" >&2
fi

say "lint and types"
# A lint or type error fails the run, but only after the tests ran: both reports are useful.
set +e
lint=0
ruff check . || lint=1
ruff format --check operator || lint=1
mypy || lint=1

say "tests"
# Most of the run waits on real time (leases, Pods, watches), so the tests run on
# ANARCHON_TEST_WORKERS pytest-xdist workers (default 3), each with its own control plane and
# stores; a file's tests, and the Docker ones, stay on one worker (tests/harness/plugin.py).
# Then the chaos soak (tests/chaos: the harsh profile on Redis and on PostgreSQL, ~5-6 min each),
# alone: its timing must not share the machine with other tests. ANARCHON_SOAK=0 leaves it out
# (ANARCHON_SOAK_PROFILE, _STORE, _SLOTS: test_soak.py). Extra arguments go to both runs.
pytest=(python3 -m pytest -p no:cacheprovider -q --durations=15)
"${pytest[@]}" -n "${ANARCHON_TEST_WORKERS:-3}" --dist loadgroup -m "not chaos" "$@"
rc=$?
soak_rc=5
if [ "${ANARCHON_SOAK:-1}" = "1" ]; then
  say "chaos soak"
  "${pytest[@]}" -m chaos "$@"
  soak_rc=$?
fi
set -e
say "done"
# 5: pytest collected nothing. For the whole suite each run must collect tests; with arguments
# (tests/run.sh tests/engine selects no soak) one of them must.
none=0
if [ $# -eq 0 ]; then
  [ "$rc" -eq 5 ] && none=1
  [ "${ANARCHON_SOAK:-1}" = "1" ] && [ "$soak_rc" -eq 5 ] && none=1
else
  [ "$rc" -eq 5 ] && [ "$soak_rc" -eq 5 ] && none=1
fi
if [ "$none" -eq 1 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
[ "$rc" -eq 5 ] && rc=0
[ "$soak_rc" -ne 5 ] && [ "$rc" -eq 0 ] && rc=$soak_rc
if [ "$rc" -eq 0 ] && [ "$lint" -ne 0 ]; then
  echo "the tests passed, but ruff or mypy did not (see above)" >&2
  exit 1
fi
exit "$rc"

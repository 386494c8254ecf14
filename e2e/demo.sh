#!/usr/bin/env bash
# The one command: a local Kubernetes control plane, a SQLite store, three all-active operator
# replicas and an example job; prints `kubectl get anarchonruns -o wide` as runs fill up, each
# claimed by one replica. Ctrl-C stops everything.
#
#   bash e2e/demo.sh                          # examples/every-10s.yaml
#   bash e2e/demo.sh examples/forbid-overlap.yaml --replicas 3 --seconds 120
#
# Needs: Python >= 3.11, Go >= 1.24 and openssl for the first build of the control plane
# (20-30 minutes on 2 cores, then cached in ~/.cache/anarchon), kubectl (optional: without it
# the demo prints the same table itself). No Docker, no cluster, no network after the build.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "demo: Python >= 3.11 is needed (set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi

echo "demo: building (or reusing) the test control plane binaries..." >&2
bash e2e/controlplane/build.sh >&2

# demo.py runs the operator from operator/ (PYTHONPATH): only its dependencies must be installed.
if ! PYTHONPATH="$repo/operator" "$python" -c 'import anarchon.cli, aiohttp, orjson, yaml' 2>/dev/null; then
  echo "demo: installing anarchon with its operator extras (pip install -e '.[operator]')..." >&2
  "$python" -m pip install -q -e ".[operator]" >&2
fi

exec "$python" e2e/demo.py "$@"

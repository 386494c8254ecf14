#!/usr/bin/env bash
# End-to-end on a real cluster (kind): build the image, load it, helm install the chart with the
# bundled Redis, apply the examples, wait for runs from several replicas, kill the replica running a
# long run and check that another one takes it over.
#
#   bash e2e/kind/run.sh            # creates kind cluster "anarchon-e2e", deletes it at the end
#   KEEP=1 bash e2e/kind/run.sh     # keep the cluster (and reuse it on the next run)
#
# Needs Docker (a running engine), kind, kubectl and helm (PATH, or the one built by
# e2e/controlplane/build.sh). Exit codes: 0 passed, 1 failed, 77 a tool is missing (skipped).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
cluster="${KIND_CLUSTER:-anarchon-e2e}"
image="anarchon:e2e"
release_ns="anarchon-system"
jobs_ns="default"
ctx="kind-${cluster}"

log() { echo "kind-e2e: $*" >&2; }
die() { log "FAILED: $*"; dump; exit 1; }
dump() {
  kubectl --context "$ctx" get pods -A -o wide >&2 2>/dev/null || true
  kubectl --context "$ctx" get anarchonjobs,anarchonruns -n "$jobs_ns" -o wide >&2 2>/dev/null || true
  kubectl --context "$ctx" -n "$release_ns" logs -l app.kubernetes.io/component=operator --tail=40 --prefix >&2 2>/dev/null || true
}

helm_bin="$(command -v helm || true)"
if [ -z "$helm_bin" ]; then
  cand="$(bash e2e/controlplane/build.sh --print-bin-dir)/helm"
  [ -x "$cand" ] && helm_bin="$cand"
fi
for t in docker kind kubectl; do
  command -v "$t" >/dev/null 2>&1 || { log "SKIP: '$t' is not installed"; exit 77; }
done
[ -n "$helm_bin" ] || { log "SKIP: helm is not installed (nor built by e2e/controlplane/build.sh)"; exit 77; }
docker info >/dev/null 2>&1 || { log "SKIP: the Docker engine is not reachable (docker info failed)"; exit 77; }

cleanup() {
  if [ "${KEEP:-0}" != "1" ]; then
    log "deleting kind cluster $cluster"
    kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  log "creating kind cluster $cluster"
  kind create cluster --name "$cluster" --config e2e/kind/kind-config.yaml --wait 120s
fi

log "building $image"
docker build -t "$image" .
kind load docker-image "$image" --name "$cluster"

log "installing the chart (3 replicas, bundled Redis)"
"$helm_bin" upgrade --install anarchon charts/anarchon --kube-context "$ctx" \
  --namespace "$release_ns" --create-namespace \
  --set image.repository=anarchon --set image.tag=e2e --set image.pullPolicy=Never \
  --set redis.enabled=true --set podAntiAffinity=hard \
  --wait --timeout 5m
kubectl --context "$ctx" -n "$release_ns" rollout status deployment/anarchon --timeout=180s
nodes="$(kubectl --context "$ctx" -n "$release_ns" get pods -l app.kubernetes.io/component=operator \
  -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | wc -l)"
[ "$nodes" -eq 3 ] || die "the 3 replicas are on $nodes nodes, expected 3"

log "applying the examples"
kubectl --context "$ctx" -n "$jobs_ns" apply -f examples/

# Runs from several replicas: every-10s keeps 20 successful runs.
deadline=$(( $(date +%s) + 180 ))
while :; do
  instances="$(kubectl --context "$ctx" -n "$jobs_ns" get anarchonruns -l anarchon.io/job=every-10s \
    -o jsonpath='{range .items[?(@.status.phase=="Succeeded")]}{.status.instance}{"\n"}{end}' | sort | uniq -c || true)"
  runs="$(echo "$instances" | awk '{s+=$1} END {print s+0}')"
  distinct="$(echo "$instances" | grep -c . || true)"
  [ "$runs" -ge 4 ] && [ "$distinct" -ge 2 ] && break
  [ "$(date +%s)" -lt "$deadline" ] || die "every-10s: $runs succeeded runs from $distinct replicas after 180s"
  sleep 5
done
log "every-10s: $runs succeeded runs, by replica:"; echo "$instances" >&2

# Takeover: start a long run now, kill the replica that runs it, watch another replica take it over.
kubectl --context "$ctx" -n "$jobs_ns" annotate --overwrite anarchonjob long-takeover \
  "anarchon.io/trigger=$(date -u +%Y-%m-%dT%H:%M:%S.000Z)"
deadline=$(( $(date +%s) + 120 ))
while :; do
  line="$(kubectl --context "$ctx" -n "$jobs_ns" get anarchonruns -l anarchon.io/job=long-takeover \
    -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name} {.status.instance}{"\n"}{end}' | head -1 || true)"
  [ -n "$line" ] && break
  [ "$(date +%s)" -lt "$deadline" ] || die "long-takeover: no Running run after 120s"
  sleep 2
done
run="${line%% *}"; victim="${line##* }"
log "long-takeover: run $run is running on $victim; killing that pod"
kubectl --context "$ctx" -n "$release_ns" delete pod "$victim" --grace-period=0 --force --wait=false
deadline=$(( $(date +%s) + 120 ))
while :; do
  now="$(kubectl --context "$ctx" -n "$jobs_ns" get anarchonrun "$run" -o jsonpath='{.status.instance}' || true)"
  phase="$(kubectl --context "$ctx" -n "$jobs_ns" get anarchonrun "$run" -o jsonpath='{.status.phase}' || true)"
  if [ -n "$now" ] && [ "$now" != "$victim" ]; then
    log "long-takeover: run $run taken over by $now (phase $phase)"
    break
  fi
  [ "$(date +%s)" -lt "$deadline" ] || die "long-takeover: run $run still on $victim 120s after it was killed"
  sleep 2
done
kubectl --context "$ctx" -n "$jobs_ns" get anarchonrun "$run" -o yaml >&2
log "PASSED"

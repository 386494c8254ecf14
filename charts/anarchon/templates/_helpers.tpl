{{/*
Names. The full name is "<release>-anarchon" unless the release name already contains the chart name.
*/}}
{{- define "anarchon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "anarchon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "anarchon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "anarchon.commonLabels" -}}
helm.sh/chart: {{ include "anarchon.chart" . }}
app.kubernetes.io/name: {{ include "anarchon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: anarchon
{{- end }}

{{- define "anarchon.labels" -}}
{{ include "anarchon.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "anarchon.redis.labels" -}}
{{ include "anarchon.commonLabels" . }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "anarchon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "anarchon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "anarchon.redis.fullname" -}}
{{- printf "%s-redis" (include "anarchon.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "anarchon.redis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "anarchon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "anarchon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "anarchon.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "anarchon.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Cluster-wide mode (no watchNamespaces) or namespaced mode: "true" / "".
*/}}
{{- define "anarchon.clusterWide" -}}
{{- if not .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
Which store the operator uses, as one word: redis-bundled, sqlite, url, secret. Fails with the fix when
the values contradict each other (sqlite is a file in one pod: one replica only).
*/}}
{{- define "anarchon.storeSource" -}}
{{- if .Values.redis.enabled }}
{{- if ne .Values.store.type "redis" }}
{{- fail (printf "redis.enabled=true bundles a Redis store, but store.type is %q: set store.type=redis or redis.enabled=false" .Values.store.type) }}
{{- end }}
{{- print "redis-bundled" }}
{{- else if and (eq .Values.store.type "sqlite") (not .Values.store.url) }}
{{- print "sqlite" }}
{{- else if .Values.store.url }}
{{- print "url" }}
{{- else if .Values.store.existingSecret.name }}
{{- print "secret" }}
{{- else }}
{{- fail "no store: set store.existingSecret.name (a Secret with the store URL), store.url, redis.enabled=true, or store.type=sqlite with replicaCount=1" }}
{{- end }}
{{- end }}

{{/*
The RBAC rules the operator needs in the namespaces it watches (a Role per namespace, or the ClusterRole).
Keep in sync with tests/chart/test_rbac.py, which checks them against the API server.
*/}}
{{- define "anarchon.namespacedRules" -}}
- apiGroups: ["anarchon.io"]
  resources: ["anarchonjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["anarchon.io"]
  resources: ["anarchonjobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["anarchon.io"]
  resources: ["anarchonruns"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
- apiGroups: ["anarchon.io"]
  resources: ["anarchonruns/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: [""]
  resources: ["pods"]
  # patch: a runner that adopts a Pod moves its anarchon.io/follower label to its own replica.
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
redis.maxmemory in bytes (Redis units: k=1000, kb=1024, m=10^6, mb=1024^2, g=10^9, gb=1024^3; case-insensitive).
*/}}
{{- define "anarchon.redis.maxmemoryBytes" -}}
{{- $v := lower (toString .Values.redis.maxmemory) }}
{{- $units := dict "" 1 "b" 1 "k" 1000 "kb" 1024 "m" 1000000 "mb" 1048576 "g" 1000000000 "gb" 1073741824 }}
{{- $unit := regexReplaceAll "^[0-9]+" $v "" }}
{{- if not (hasKey $units $unit) }}
{{- fail (printf "redis.maxmemory %q: give a number of bytes with an optional Redis unit (k, kb, m, mb, g, gb), e.g. 200mb" $v) }}
{{- end }}
{{- mul (regexFind "^[0-9]+" $v | int64) (get $units $unit) }}
{{- end }}

{{/*
A Kubernetes memory quantity in bytes, or "" when it is not a plain whole number with an optional suffix
(e.g. 0.5Gi or 1e9: not checked).
*/}}
{{- define "anarchon.quantityBytes" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- int64 . }}
{{- else }}
{{- $q := toString . }}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- if regexMatch "^[0-9]+(k|M|G|T|Ki|Mi|Gi|Ti)?$" $q }}
{{- mul (regexFind "^[0-9]+" $q | int64) (get $units (regexReplaceAll "^[0-9]+" $q "")) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Fails when redis.maxmemory is not below the Redis container's memory limit: Redis would be OOM-killed (a
restart) before it starts refusing writes.
*/}}
{{- define "anarchon.redis.checkMemory" -}}
{{- $limit := "" }}
{{- with .Values.redis.resources.limits }}{{ with .memory }}{{ $limit = . }}{{ end }}{{ end }}
{{- if $limit }}
{{- $limitBytes := include "anarchon.quantityBytes" $limit }}
{{- $maxBytes := include "anarchon.redis.maxmemoryBytes" . }}
{{- if and $limitBytes (ge (int64 $maxBytes) (int64 $limitBytes)) }}
{{- fail (printf "redis.maxmemory=%s (%s bytes) must be below redis.resources.limits.memory=%v (%s bytes), with room for Redis' own overhead and the AOF rewrite: at the limit the kernel kills Redis (a restart) before Redis refuses writes" (toString .Values.redis.maxmemory) $maxBytes $limit $limitBytes) }}
{{- end }}
{{- end }}
{{- end }}

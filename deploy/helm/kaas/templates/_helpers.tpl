{{/* Names */}}
{{- define "kaas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kaas.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "kaas.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kaas.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kaas.headless" -}}
{{- printf "%s-headless" (include "kaas.fullname" .) -}}
{{- end -}}

{{- define "kaas.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "kaas.standardLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of an object or a pod template, called with (dict "ctx" $ "user" {...} "own" {...}).
     Later sources win: commonLabels, then `user` (labels the user set for this object, such as
     podLabels), then the chart's standard labels, then `own` (the chart's labels for this object,
     e.g. its component). Selectors match the chart's labels, so neither commonLabels nor
     podLabels can detach a pod from its StatefulSet or Service. Rendered as one map, so a key
     set in two places appears once. "minimal": true keeps only name and instance of the
     standard labels, for a pod template that should not roll when the chart version changes. */}}
{{- define "kaas.labelsWith" -}}
{{- $labels := dict -}}
{{- $chart := include "kaas.standardLabels" .ctx | fromYaml -}}
{{- if .minimal }}{{ $chart = pick $chart "app.kubernetes.io/name" "app.kubernetes.io/instance" }}{{ end -}}
{{- range $source := list .ctx.Values.commonLabels .user $chart .own -}}
{{- range $k, $v := $source -}}
{{- $_ := set $labels $k (toString $v) -}}
{{- end -}}
{{- end -}}
{{- toYaml $labels -}}
{{- end -}}

{{- define "kaas.labels" -}}
{{- include "kaas.labelsWith" (dict "ctx" .) -}}
{{- end -}}

{{- define "kaas.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kaas.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The broker image: repository@digest when a digest is set (immutable; the tag is then
     ignored), else repository:tag. */}}
{{- define "kaas.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- $tag := toString (default .Chart.AppVersion .Values.image.tag) -}}
{{- if or (eq $tag "latest") (eq $tag "") -}}
{{- fail "image.tag must name a version (not \"latest\"): rolling upgrades are driven by tag changes" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* host:port of the client Service, what in-cluster clients (the hooks too) bootstrap from. */}}
{{- define "kaas.bootstrap" -}}
{{- $host := printf "%s.%s.svc" (include "kaas.fullname" .) .Release.Namespace -}}
{{- if .Values.clusterDomain }}{{ $host = printf "%s.%s" $host .Values.clusterDomain }}{{ end -}}
{{- printf "%s:%d" $host (int .Values.ports.kafka) -}}
{{- end -}}

{{/* A config value as Kafka reads it: YAML numbers arrive as float64, and 536870912 would
     print as 5.36870912e+08; whole numbers print as integers, fractions as they are. */}}
{{- define "kaas.configValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* One single-quoted shell word for a script in a container command: "'" is closed, escaped and
     reopened, and every "$" is doubled because the kubelet expands "$(VAR)" in commands (and
     turns "$$" back into "$"). */}}
{{- define "kaas.shellWord" -}}
{{- printf "'%s'" (replace "'" "'\\''" (toString .)) | replace "$" "$$" -}}
{{- end -}}

{{/* Bytes glommio registers for one ring: page-aligned, at least 64 KiB. */}}
{{- define "kaas.registeredBytes" -}}
{{- $b := int64 . -}}
{{- max 65536 (mul (div (add $b 4095) 4096) 4096) -}}
{{- end -}}

{{/* --io-memory-bytes: explicit, or the largest multiple of 64 KiB <= 2 MiB whose registrations (3 per shard) fit the pod memlock limit less the rings' headroom. */}}
{{- define "kaas.ioMemoryBytes" -}}
{{- $shards := int64 .Values.shards -}}
{{- if lt $shards 1 -}}{{- fail "shards must be >= 1" -}}{{- end -}}
{{- if ne (toString .Values.ioUring.ioMemoryBytes) "" -}}
{{- $io := int64 .Values.ioUring.ioMemoryBytes -}}
{{- $need := add (mul $shards 3 (int64 (include "kaas.registeredBytes" $io))) (int64 .Values.ioUring.ringHeadroomBytes) -}}
{{- if and (not .Values.ioUring.ipcLock) (gt $need (int64 .Values.ioUring.podMemlockBytes)) -}}
{{- fail (printf "ioUring.ioMemoryBytes=%d with %d shards needs %d bytes of locked memory (3 registrations per shard plus ringHeadroomBytes), more than ioUring.podMemlockBytes=%d: lower ioMemoryBytes or set ioUring.ipcLock=true" $io $shards $need (int64 .Values.ioUring.podMemlockBytes)) -}}
{{- end -}}
{{- $io -}}
{{- else if .Values.ioUring.ipcLock -}}
2097152
{{- else -}}
{{- $budget := sub (int64 .Values.ioUring.podMemlockBytes) (int64 .Values.ioUring.ringHeadroomBytes) -}}
{{- $fit := mul (div (div $budget (mul 3 $shards)) 65536) 65536 -}}
{{- if lt $fit 65536 -}}
{{- fail (printf "ioUring.podMemlockBytes=%d is too small for %d shards (each registers at least 3 x 64 KiB): raise the nodes' memlock limit, set ioUring.ipcLock=true, or use fewer shards" (int64 .Values.ioUring.podMemlockBytes) $shards) -}}
{{- end -}}
{{- min 2097152 $fit -}}
{{- end -}}
{{- end -}}

{{- define "kaas.terminationGracePeriodSeconds" -}}
{{- $drain := int64 .Values.drainTimeoutSeconds -}}
{{- if eq (toString .Values.terminationGracePeriodSeconds) "" -}}
{{- add $drain 30 -}}
{{- else -}}
{{- $t := int64 .Values.terminationGracePeriodSeconds -}}
{{- if lt $t $drain -}}
{{- fail (printf "terminationGracePeriodSeconds=%d is shorter than drainTimeoutSeconds=%d: the kubelet would SIGKILL a draining broker" $t $drain) -}}
{{- end -}}
{{- $t -}}
{{- end -}}
{{- end -}}

{{/* Checks of value combinations the broker cannot run with. */}}
{{/* The data claim's access modes: as set, else RWO for one broker and RWX for a cluster. */}}
{{- define "kaas.accessModes" -}}
{{- if .Values.persistence.accessModes -}}
{{- toYaml .Values.persistence.accessModes -}}
{{- else if .Values.cluster.enabled -}}
- ReadWriteMany
{{- else -}}
- ReadWriteOnce
{{- end -}}
{{- end -}}

{{- define "kaas.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.cluster.enabled) -}}
{{- fail "replicaCount > 1 needs cluster.enabled=true (several brokers sharing one volume need cluster mode); a single-node broker locks its data directory" -}}
{{- end -}}
{{- if and .Values.cluster.enabled .Values.persistence.enabled (not .Values.persistence.existingClaim) (not (has "ReadWriteMany" (include "kaas.accessModes" . | fromYamlArray))) -}}
{{- fail "cluster mode shares one volume between brokers: persistence.accessModes must include ReadWriteMany" -}}
{{- end -}}
{{- if and .Values.cluster.enabled (not .Values.persistence.enabled) -}}
{{- fail "cluster mode needs the shared volume: persistence.enabled=true" -}}
{{- end -}}
{{- if not (has .Values.seccomp.type (list "Localhost" "Unconfined" "RuntimeDefault")) -}}
{{- fail "seccomp.type must be Localhost, Unconfined or RuntimeDefault" -}}
{{- end -}}
{{- if and .Values.external.enabled (not .Values.external.advertisedHostPattern) -}}
{{- fail "external.enabled needs external.advertisedHostPattern (e.g. \"kaas-{ordinal}.kafka.example.com\" or \"{hostIP}\")" -}}
{{- end -}}
{{- if and .Values.external.enabled (not (has .Values.external.type (list "LoadBalancer" "NodePort"))) -}}
{{- fail "external.type must be LoadBalancer or NodePort" -}}
{{- end -}}
{{- if not (has .Values.podAntiAffinity (list "hard" "soft" "none")) -}}
{{- fail "podAntiAffinity must be hard, soft or none" -}}
{{- end -}}
{{- if and .Values.service.loadBalancerIP (ne .Values.service.type "LoadBalancer") -}}
{{- fail "service.loadBalancerIP needs service.type=LoadBalancer" -}}
{{- end -}}
{{- with .Values.service.nodePorts.kafka -}}
{{- if eq $.Values.service.type "ClusterIP" -}}
{{- fail "service.nodePorts.kafka needs service.type NodePort or LoadBalancer" -}}
{{- end -}}
{{- $base := int $.Values.external.nodePortBase -}}
{{- if and $.Values.external.enabled (eq $.Values.external.type "NodePort") (ge (int .) $base) (lt (int .) (add $base (int $.Values.replicaCount))) -}}
{{- fail (printf "service.nodePorts.kafka=%d is one of the per-broker node ports of external access (external.nodePortBase=%d + ordinal): pick another" (int .) $base) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled -}}
{{- fail "enable one of metrics.serviceMonitor and metrics.podMonitor: with both, every broker is scraped twice as job \"kaas\"" -}}
{{- end -}}
{{- $names := list -}}
{{- range .Values.topics -}}
{{- if has .name $names -}}
{{- fail (printf "topics: %q is declared twice" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- end -}}

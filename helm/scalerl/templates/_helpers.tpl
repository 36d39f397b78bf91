{{/* vim: set filetype=mustache: */}}

{{- define "scalerl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "scalerl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "scalerl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "scalerl.labels" -}}
helm.sh/chart: {{ include "scalerl.chart" . }}
app.kubernetes.io/name: {{ include "scalerl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: scalerl
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "generator") */}}
{{- define "scalerl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scalerl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Release-wide selector (every pod of this release). */}}
{{- define "scalerl.releaseSelector" -}}
app.kubernetes.io/name: {{ include "scalerl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The ScaleRL components: values key -> resource suffix, `scalerl-serve` name, GPU or not. */}}
{{- define "scalerl.components" -}}
api: {component: api, serve: api, gpu: false, cpuImage: true}
generator: {component: generator, serve: generator, gpu: true, cpuImage: false}
evaluator: {component: evaluator, serve: generator, gpu: true, cpuImage: false}
rewardGrader: {component: reward-grader, serve: reward-grader, gpu: false, cpuImage: true}
replayBuffer: {component: replay-buffer, serve: replay-buffer, gpu: false, cpuImage: true}
learner: {component: learner, serve: learner, gpu: true, cpuImage: false}
forecaster: {component: forecaster, serve: forecaster, gpu: false, cpuImage: true}
weightBroadcast: {component: weight-broadcast, serve: weight-broadcast, gpu: false, cpuImage: true}
{{- end -}}

{{- define "scalerl.componentName" -}}
{{- printf "%s-%s" (include "scalerl.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "scalerl.image" -}}
{{- $c := .c -}}
{{- $tag := $c.image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if .root.Values.image.registry -}}
{{- printf "%s/%s:%s" .root.Values.image.registry $c.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $c.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Worker pods' account: serviceAccount.name, else <fullname> (created) or "default" (not created). */}}
{{- define "scalerl.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else if .Values.serviceAccount.create -}}
{{- include "scalerl.fullname" . -}}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{/* The api's account: serviceAccount.apiName, else <fullname>-api (created) or the workers' account. */}}
{{- define "scalerl.apiServiceAccountName" -}}
{{- if .Values.serviceAccount.apiName -}}
{{- .Values.serviceAccount.apiName -}}
{{- else if .Values.serviceAccount.create -}}
{{- printf "%s-api" (include "scalerl.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- include "scalerl.serviceAccountName" . -}}
{{- end -}}
{{- end -}}

{{/* CRD-backed objects render only where their API is served (helm template: pass --api-versions). */}}
{{- define "scalerl.hasServiceMonitor" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" -}}true{{- end -}}
{{- end -}}
{{- define "scalerl.hasPodMonitor" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PodMonitor" -}}true{{- end -}}
{{- end -}}
{{- define "scalerl.hasPrometheusRule" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule" -}}true{{- end -}}
{{- end -}}
{{/* The generator replica count belongs to an autoscaler: KEDA (when its API is served) or an HPA. */}}
{{- define "scalerl.autoscaled" -}}
{{- if and .Values.autoscaling.enabled .Values.generator.enabled -}}
{{- if eq .Values.autoscaling.mode "hpa" -}}true
{{- else if .Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject" -}}true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The in-chart Valkey password Secret. */}}
{{- define "scalerl.redisSecretName" -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis" (include "scalerl.fullname" .)) -}}
{{- end -}}

{{/* Valkey maxmemory in bytes: redis.maxmemory, else 60% of resources.limits.memory (Ki/Mi/Gi/Ti, K/M/G/T). */}}
{{- define "scalerl.redisMaxmemory" -}}
{{- if .Values.redis.maxmemory -}}
{{- .Values.redis.maxmemory -}}
{{- else -}}
{{- $limit := toString ((.Values.redis.resources.limits | default dict).memory | default "") -}}
{{- if not $limit -}}{{- fail "redis: set redis.maxmemory or redis.resources.limits.memory (maxmemory = 60% of it)" -}}{{- end -}}
{{- $number := regexFind "^[0-9]+" $limit -}}
{{- $unit := trimPrefix $number $limit -}}
{{- $scale := dict "" 1 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if or (not $number) (not (hasKey $scale $unit)) -}}{{- fail (printf "redis.resources.limits.memory %q: use an integer with Ki/Mi/Gi/Ti or K/M/G/T" $limit) -}}{{- end -}}
{{- div (mul (int64 $number) (index $scale $unit) 60) 100 -}}
{{- end -}}
{{- end -}}

{{/* torch threads of one process: the CPU request (500m, 2, "7.5") rounded up, shared by `procs` processes,
at least 1: (dict "cpu" "8" "procs" 2) -> 4 */}}
{{- define "scalerl.cpuThreads" -}}
{{- $cpu := toString (.cpu | default "1") -}}
{{- $cores := 1 -}}
{{- if hasSuffix "m" $cpu -}}
{{- $cores = div (add (int64 (trimSuffix "m" $cpu)) 999) 1000 -}}
{{- else -}}
{{- $cores = int64 (ceil (float64 $cpu)) -}}
{{- end -}}
{{- max 1 (div $cores (max 1 .procs)) -}}
{{- end -}}

{{- define "scalerl.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "scalerl.fullname" .)) -}}
{{- end -}}

{{- define "scalerl.redisInternal" -}}
{{- if and (not .Values.redis.external.url) (not .Values.redis.external.existingSecret) -}}true{{- end -}}
{{- end -}}

{{- define "scalerl.postgresInternal" -}}
{{- if and .Values.postgres.enabled (not .Values.postgres.external.url) (not .Values.postgres.external.existingSecret) -}}true{{- end -}}
{{- end -}}

{{- define "scalerl.postgresSecretName" -}}
{{- .Values.postgres.existingSecret | default (printf "%s-postgres" (include "scalerl.fullname" .)) -}}
{{- end -}}

{{- define "scalerl.dataClaimName" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-data" (include "scalerl.fullname" .)) -}}
{{- end -}}

{{/* host:port of a component's gRPC Service: (dict "root" $ "key" "replayBuffer") */}}
{{- define "scalerl.addr" -}}
{{- $meta := index (include "scalerl.components" .root | fromYaml) .key -}}
{{- $c := index .root.Values .key -}}
{{- printf "%s:%v" (include "scalerl.componentName" (dict "root" .root "component" $meta.component)) $c.ports.grpc -}}
{{- end -}}

{{/* Env shared by every ScaleRL service: addresses of the others. */}}
{{- define "scalerl.commonEnv" -}}
- name: SCALERL_HOST
  value: {{ .Values.host | quote }}
- name: SCALERL_CONTROL_PLANE_ADDR
  value: {{ include "scalerl.addr" (dict "root" . "key" "api") | quote }}
- name: SCALERL_REPLAY_BUFFER_ADDR
  value: {{ include "scalerl.addr" (dict "root" . "key" "replayBuffer") | quote }}
- name: SCALERL_REWARD_GRADER_ADDR
  value: {{ include "scalerl.addr" (dict "root" . "key" "rewardGrader") | quote }}
- name: SCALERL_WEIGHT_BROADCAST_ADDR
  value: {{ include "scalerl.addr" (dict "root" . "key" "weightBroadcast") | quote }}
- name: SCALERL_FORECASTER_ADDR
  value: {{ include "scalerl.addr" (dict "root" . "key" "forecaster") | quote }}
- name: SCALERL_EVALUATOR_ADDR
  value: {{ include "scalerl.addr" (dict "root" . "key" "evaluator") | quote }}
- name: SCALERL_LEARNER_ADDR
  value: {{ include "scalerl.addr" (dict "root" . "key" "learner") | quote }}
- name: SCALERL_DATA_DIR
  value: /data
- name: SCALERL_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "scalerl.authSecretName" . }}
      key: {{ ternary .Values.auth.existingSecretKey "token" (not (empty .Values.auth.existingSecret)) }}
{{- end -}}

{{- define "scalerl.redisEnv" -}}
{{- if and (include "scalerl.redisInternal" .) .Values.redis.auth.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "scalerl.redisSecretName" . }}
      key: {{ .Values.redis.auth.existingSecretKey }}
{{- end }}
- name: REDIS_URL
{{- if .Values.redis.external.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.existingSecretKey }}
{{- else if .Values.redis.external.url }}
  valueFrom:
    secretKeyRef:
      name: {{ include "scalerl.fullname" . }}-external
      key: redis-url
{{- else if .Values.redis.auth.enabled }}
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s-redis:%v/0" (include "scalerl.fullname" .) .Values.redis.port | quote }}
{{- else }}
  value: {{ printf "redis://%s-redis:%v/0" (include "scalerl.fullname" .) .Values.redis.port | quote }}
{{- end }}
{{- end -}}

{{- define "scalerl.databaseEnv" -}}
{{- if .Values.postgres.external.existingSecret }}
- name: SCALERL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.postgres.external.existingSecret }}
      key: {{ .Values.postgres.external.existingSecretKey }}
{{- else if .Values.postgres.external.url }}
- name: SCALERL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "scalerl.fullname" . }}-external
      key: database-url
{{- else if .Values.postgres.enabled }}
- name: SCALERL_POSTGRES_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "scalerl.postgresSecretName" . }}
      key: password
- name: SCALERL_DATABASE_URL
  value: {{ printf "postgresql+psycopg://%s:$(SCALERL_POSTGRES_PASSWORD)@%s-postgres:5432/%s" .Values.postgres.username (include "scalerl.fullname" .) .Values.postgres.database | quote }}
{{- end }}
{{- end -}}

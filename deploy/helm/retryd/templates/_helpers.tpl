{{/* Names, labels and the settings file shared by the templates. */}}

{{- define "retryd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-retryd", or the release name alone when it already contains the chart's name
(`helm install retryd ...` gives the kustomize base's names: retryd, retryd-config...). */}}
{{- define "retryd.fullname" -}}
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

{{- define "retryd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "retryd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: retryd
{{- end -}}

{{- define "retryd.labels" -}}
{{ include "retryd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "retryd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "retryd.secretName" -}}
{{- if .Values.secret.existingSecret -}}
{{- .Values.secret.existingSecret -}}
{{- else -}}
{{- printf "%s-secrets" (include "retryd.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Which files the secrets volume holds: "apiTokens", "kafkaProperties" (a list as JSON). */}}
{{- define "retryd.secretFiles" -}}
{{- $files := list -}}
{{- if .Values.secret.existingSecret -}}
{{- if .Values.secret.existingSecretKeys.apiTokens }}{{ $files = append $files "apiTokens" }}{{ end -}}
{{- if .Values.secret.existingSecretKeys.kafkaProperties }}{{ $files = append $files "kafkaProperties" }}{{ end -}}
{{- else -}}
{{- if .Values.secret.apiTokens }}{{ $files = append $files "apiTokens" }}{{ end -}}
{{- if .Values.secret.kafkaProperties }}{{ $files = append $files "kafkaProperties" }}{{ end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{- define "retryd.configPath" -}}/etc/retryd/config/retryd.toml{{- end -}}
{{- define "retryd.secretsDir" -}}/etc/retryd/secrets{{- end -}}
{{- define "retryd.stateDir" -}}/var/lib/retryd{{- end -}}

{{/* The settings: the user's, then the ones the chart owns (its mounts and ports). */}}
{{- define "retryd.settings" -}}
{{- $s := deepCopy (default dict .Values.settings) -}}
{{- $handler := .Values.handler -}}
{{- if and (not $handler) .Values.business.enabled -}}
{{- $handler = printf "http://127.0.0.1:%d%s" (int .Values.business.port) .Values.business.handlerPath -}}
{{- end -}}
{{- if not $handler -}}
{{- fail "handler: set it when business.enabled is false (the worker has nothing to call)" -}}
{{- end -}}
{{- $_ := set $s "handler" $handler -}}
{{- $_ := set $s "state_dir" (include "retryd.stateDir" .) -}}
{{- $_ := set $s "sidecar_host" "0.0.0.0" -}}
{{- $_ := set $s "sidecar_port" (int .Values.sidecar.port) -}}
{{- $files := include "retryd.secretFiles" . | fromJsonArray -}}
{{- if has "apiTokens" $files -}}
{{- $_ := set $s "api_tokens_file" (printf "%s/api-tokens" (include "retryd.secretsDir" .)) -}}
{{- end -}}
{{- if has "kafkaProperties" $files -}}
{{- $_ := set $s "kafka_file" (printf "%s/kafka.properties" (include "retryd.secretsDir" .)) -}}
{{- end -}}
{{- toJson $s -}}
{{- end -}}

{{/* One TOML value: string, boolean, number (whole numbers without a fraction: Helm reads
values files' numbers as floats), or an array of those. */}}
{{- define "retryd.tomlValue" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}{{ toJson $v }}
{{- else if kindIs "bool" $v -}}{{ $v }}
{{- else if kindIs "float64" $v -}}{{ if eq (float64 (int64 $v)) $v }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- else if kindIs "slice" $v -}}[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "retryd.tomlValue" $e }}{{ end }}]
{{- else -}}{{ $v }}
{{- end -}}
{{- end -}}

{{/* retryd.toml: scalar and array settings first, then each table ([kafka], [error_routes]...). */}}
{{- define "retryd.toml" -}}
{{- $s := include "retryd.settings" . | fromJson -}}
# retryd settings of the pod, rendered by the Helm chart from .Values.settings (every key is
# documented in config/retryd.toml). RETRYD_* variables override them.
{{ range $k := keys $s | sortAlpha }}
{{- $v := get $s $k -}}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ $k }} = {{ include "retryd.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k := keys $s | sortAlpha }}
{{- $v := get $s $k -}}
{{- if kindIs "map" $v }}

[{{ $k }}]
{{- range $kk := keys $v | sortAlpha }}
{{ toJson $kk }} = {{ include "retryd.tomlValue" (get $v $kk) }}
{{- end }}
{{- end }}
{{- end }}
{{ end -}}

{{/* The worker's and the sidecar's mounts (the same: they share the state dir). */}}
{{- define "retryd.mounts" -}}
- {name: state, mountPath: /var/lib/retryd}
- {name: config, mountPath: /etc/retryd/config, readOnly: true}
{{- if .secrets }}
- {name: secrets, mountPath: /etc/retryd/secrets, readOnly: true}
{{- end }}
- {name: tmp, mountPath: /tmp}
{{- end -}}

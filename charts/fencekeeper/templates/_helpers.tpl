{{- define "fencekeeper.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "fencekeeper.labels" -}}
app.kubernetes.io/name: fencekeeper
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fencekeeper.selectorLabels" -}}
app.kubernetes.io/name: fencekeeper
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fencekeeper.serviceAccountName" -}}
{{- default (include "fencekeeper.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "fencekeeper.managerUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "fencekeeper.serviceAccountName" .) -}}
{{- end -}}

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

{{- /*
fencekeeper.requireAPI fails the render, saying which API is missing and what
to do, when an option needs a kind the cluster does not serve. Arguments: a
list of the root context, the option, the group/version/Kind, and advice.
*/ -}}
{{- define "fencekeeper.requireAPI" -}}
{{- $root := index . 0 -}}{{- $option := index . 1 -}}{{- $gvk := index . 2 -}}{{- $advice := index . 3 -}}
{{- if not ($root.Capabilities.APIVersions.Has $gvk) -}}
{{- fail (printf "\n%s=true needs the %s kind, which this cluster does not serve: %s. (helm template and helm lint see no cluster: pass --api-versions %s to helm template.)" $option $gvk $advice $gvk) -}}
{{- end -}}
{{- end -}}

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
fencekeeper.image is the manager's image, REPOSITORY:TAG. It fails the
render, saying what to set, when image.repository is not set (no image is
published: a pod would only show ImagePullBackOff) or carries a tag or digest.
*/ -}}
{{- define "fencekeeper.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if not $repo -}}
{{- fail "\nimage.repository is required: no fencekeeper image is published. Build one with `make image`, push it with `make image-push IMG=REGISTRY/REPOSITORY:TAG` (or, for kind, `kind load image-archive bin/image.tar`), then pass --set image.repository=REGISTRY/REPOSITORY --set image.tag=TAG. See docs/install.md#the-image." -}}
{{- end -}}
{{- if regexMatch "[:@][^/]*$" $repo -}}
{{- fail (printf "\nimage.repository %q names a tag or digest: set the repository alone and the tag in image.tag (--set image.repository=REGISTRY/REPOSITORY --set image.tag=TAG)." $repo) -}}
{{- end -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
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

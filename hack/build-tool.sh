#!/usr/bin/env bash
# Builds one pinned tool into bin/ from the Go module proxy, only when the
# binary is missing or its pins (the tools module's go.mod/go.sum) changed.
#
#   hack/build-tool.sh kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|etcd|etcdutl|kwok|controller-gen|helm|promtool|golangci-lint
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/bin"
name="$1"

KUBE_VERSION=v1.37.2
kube_ldflags() {
	local major minor
	major="$(echo "${KUBE_VERSION#v}" | cut -d. -f1)"
	minor="$(echo "${KUBE_VERSION#v}" | cut -d. -f2)"
	local pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
	local out="-s -w"
	for p in "${pkgs[@]}"; do
		out+=" -X ${p}.gitVersion=${KUBE_VERSION} -X ${p}.gitMajor=${major} -X ${p}.gitMinor=${minor}"
		out+=" -X ${p}.gitTreeState=clean -X ${p}.buildDate=2026-01-01T00:00:00Z"
	done
	echo "${out}"
}

tags=""
case "${name}" in
kube-apiserver) mod=hack/tools; pkg=k8s.io/kubernetes/cmd/kube-apiserver; ldflags="$(kube_ldflags)" ;;
kube-controller-manager) mod=hack/tools; pkg=k8s.io/kubernetes/cmd/kube-controller-manager; ldflags="$(kube_ldflags)" ;;
kube-scheduler) mod=hack/tools; pkg=k8s.io/kubernetes/cmd/kube-scheduler; ldflags="$(kube_ldflags)" ;;
kubectl) mod=hack/tools; pkg=k8s.io/kubernetes/cmd/kubectl; ldflags="$(kube_ldflags)" ;;
kwok) mod=hack/tools/kwok; pkg=sigs.k8s.io/kwok/cmd/kwok; ldflags="-s -w" ;;
controller-gen) mod=hack/tools; pkg=sigs.k8s.io/controller-tools/cmd/controller-gen; ldflags="-s -w" ;;
etcd) mod=hack/tools/etcd; pkg=.; ldflags="-s -w" ;;
etcdutl) mod=hack/tools/etcd; pkg=go.etcd.io/etcd/etcdutl/v3; ldflags="-s -w" ;;
helm) mod=hack/tools/helm; pkg=helm.sh/helm/v3/cmd/helm; ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v3.22.0" ;;
# remove_all_sd leaves out the service-discovery plugins (cloud SDKs, about
# half of the build) that `promtool check rules` never uses.
promtool) mod=hack/tools/promtool; pkg=github.com/prometheus/prometheus/cmd/promtool; tags=remove_all_sd; ldflags="-s -w -X github.com/prometheus/common/version.Version=3.16.0" ;;
golangci-lint) mod=hack/tools/lint; pkg=github.com/golangci/golangci-lint/v2/cmd/golangci-lint; ldflags="-s -w" ;;
*) echo "build-tool: unknown tool ${name}" >&2; exit 2 ;;
esac

pin="$(cat "${ROOT}/${mod}/go.mod" "${ROOT}/${mod}/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
stamp="${BIN}/.${name}.pin"
if [[ -x "${BIN}/${name}" && -f "${stamp}" && "$(cat "${stamp}")" == "${pin}" ]]; then
	exit 0
fi

mkdir -p "${BIN}"
case "${name}" in
kube-apiserver | kube-controller-manager | kube-scheduler | kubectl) took="several minutes" ;;
*) took="a minute or two" ;;
esac
echo ">> building ${name} (${pkg}) into bin/: the first build takes ${took}"
start=$(date +%s)
(cd "${ROOT}/${mod}" && go build -tags "${tags}" -ldflags "${ldflags}" -o "${BIN}/${name}.tmp" "${pkg}")
mv "${BIN}/${name}.tmp" "${BIN}/${name}"
echo "${pin}" >"${stamp}"
echo ">> built bin/${name} in $(($(date +%s) - start))s"

#!/usr/bin/env bash
# make helm-local: the Helm chart, installed by bin/helm, running on the
# local control plane (docs/install.md, "Trying the chart locally").
#
# Starts a bare control plane (BARE=1 hack/dev-up.sh) unless one runs, in
# which devcluster runs the pods of fencekeeper's Deployment as bin/manager
# processes (hack/devcluster/localpods); installs or upgrades the release;
# waits for the rollout, as the chart's NOTES say. Arguments go to
# `helm upgrade --install` (e.g. --set claims.expiredRetention=1h).
#
#   HELM_RELEASE (default fencekeeper), HELM_NAMESPACE (default
#   fencekeeper-system), DEV_DIR, APISERVER_PORT: as for dev-up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="${DEV_DIR:-${ROOT}/.dev}"
RELEASE="${HELM_RELEASE:-fencekeeper}"
NS="${HELM_NAMESPACE:-fencekeeper-system}"

if [[ "${CLUSTER:-}" == "full" ]]; then
	echo "helm-local: not with CLUSTER=full: there kube-controller-manager runs the chart's Deployment and kwok fakes its pods (Ready, running nothing), so nothing would serve the webhook" >&2
	exit 2
fi
if [[ -f "${DEV}/devcluster.pid" && "$(cat "/proc/$(cat "${DEV}/devcluster.pid")/comm" 2>/dev/null)" == "devcluster" ]]; then
	if [[ "$(cat "${DEV}/mode" 2>/dev/null)" != "bare" ]]; then
		echo "helm-local: a 'make dev-up' with its own manager (or CLUSTER=full) runs in ${DEV}: its CRD and webhook would collide with the chart's; 'make dev-down' first" >&2
		exit 1
	fi
	echo "helm-local: using the bare control plane running in ${DEV}"
else
	BARE=1 "${ROOT}/hack/dev-up.sh"
fi

export KUBECONFIG="${DEV}/kubeconfig"
# No image is pulled here: devcluster runs bin/manager for the pods. The
# chart requires a repository all the same.
"${ROOT}/bin/helm" upgrade --install "${RELEASE}" "${ROOT}/charts/fencekeeper" -n "${NS}" --create-namespace \
	--set image.repository=ghcr.io/fencekeeper/fencekeeper --set image.tag=dev "$@"
deployment="$("${ROOT}/bin/kubectl" -n "${NS}" get deployments -l "app.kubernetes.io/instance=${RELEASE},app.kubernetes.io/name=fencekeeper" -o name)"
"${ROOT}/bin/kubectl" -n "${NS}" rollout status "${deployment}" --timeout=180s
cat <<EOF

helm-local: release ${RELEASE} runs in ${NS}; its pods are bin/manager processes of devcluster
(output: ${DEV}/pods/${NS}_<pod>/manager.log). In another shell:

    export KUBECONFIG=${KUBECONFIG}
    kubectl -n ${NS} get pods,endpointslices

'make dev-down' stops everything; 'bin/helm uninstall ${RELEASE} -n ${NS}' removes the release.
EOF

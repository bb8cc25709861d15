#!/usr/bin/env bash
# Plays the kubelet's part on a local control plane (no kubelet runs there):
# sets pods Running with their containers ready or not ready.
#
#   hack/play-kubelet.sh NAMESPACE ready|unready POD [POD...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KUBECTL="${KUBECTL:-${ROOT}/bin/kubectl}"
export KUBECONFIG="${KUBECONFIG:-${ROOT}/.dev/kubeconfig}"
if [[ $# -lt 3 || ( "$2" != ready && "$2" != unready ) ]]; then
	echo "usage: $0 NAMESPACE ready|unready POD [POD...]" >&2
	exit 2
fi
ns="$1" status=True
[[ "$2" == unready ]] && status=False
shift 2
now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
for pod in "$@"; do
	"${KUBECTL}" -n "${ns}" patch pod "${pod}" --subresource=status --type=strategic -p \
		"{\"status\":{\"phase\":\"Running\",\"conditions\":[{\"type\":\"ContainersReady\",\"status\":\"${status}\",\"lastTransitionTime\":\"${now}\"}]}}" >/dev/null
	echo "pod ${ns}/${pod}: Running, containers ready=${status}"
done

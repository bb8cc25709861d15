#!/usr/bin/env bash
# Starts the local control plane and the manager in the background (make dev-up).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="${DEV_DIR:-${ROOT}/.dev}"
mkdir -p "${DEV}"

if [[ -f "${DEV}/devcluster.pid" && "$(cat "/proc/$(cat "${DEV}/devcluster.pid")/comm" 2>/dev/null)" == "devcluster" ]]; then
	echo "dev-up: already running (pid $(cat "${DEV}/devcluster.pid")); 'make dev-down' stops it"
	exit 0
fi
if [[ -f "${DEV}/devcluster.pid" ]]; then
	# A run that died without stopping what it started: stop that first.
	"${ROOT}/hack/dev-down.sh"
fi
go build -o "${ROOT}/bin/devcluster" "${ROOT}/hack/devcluster"
rm -f "${DEV}/ready"
# A session of its own, so dev-down can stop the whole process group.
# BARE=1: control plane only (to try the Helm chart).
setsid "${ROOT}/bin/devcluster" --dir "${DEV}" --manager "${MANAGER_BIN:-${ROOT}/bin/manager}" >"${DEV}/devcluster.log" 2>&1 </dev/null &
pid=$!
echo "${pid}" >"${DEV}/devcluster.pid"
for _ in $(seq 1 240); do
	if [[ -f "${DEV}/ready" ]]; then
		if [[ "${BARE:-}" == "1" ]]; then
			echo "dev-up: bare control plane running (pid ${pid}): no CRDs, webhook, policies or manager (BARE=1: install the Helm chart); log: ${DEV}/devcluster.log"
		else
			echo "dev-up: control plane and manager running (pid ${pid}); log: ${DEV}/devcluster.log"
		fi
		echo "    export KUBECONFIG=${DEV}/kubeconfig"
		exit 0
	fi
	if ! kill -0 "${pid}" 2>/dev/null; then
		echo "dev-up: failed; the last lines of ${DEV}/devcluster.log:" >&2
		tail -n 20 "${DEV}/devcluster.log" >&2
		rm -f "${DEV}/devcluster.pid"
		exit 1
	fi
	sleep 0.5
done
echo "dev-up: not ready after 120s; see ${DEV}/devcluster.log" >&2
exit 1

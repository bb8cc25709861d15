#!/usr/bin/env bash
# Stops what dev-up started: the devcluster process group (control plane and manager).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="${DEV_DIR:-${ROOT}/.dev}"
pidfile="${DEV}/devcluster.pid"
if [[ ! -f "${pidfile}" ]]; then
	echo "dev-down: nothing running (no .dev/devcluster.pid)"
	exit 0
fi
pid="$(cat "${pidfile}")"
if kill -0 "${pid}" 2>/dev/null; then
	kill -TERM "${pid}" 2>/dev/null || true
	for _ in $(seq 1 60); do
		kill -0 "${pid}" 2>/dev/null || break
		sleep 0.5
	done
fi
# Whatever is left of the process group (the manager, kube-controller-manager, kwok).
kill -KILL -- "-${pid}" 2>/dev/null || true
# etcd and kube-apiserver run in process groups of their own (envtest's):
# devcluster stops them itself, unless it was killed first. Each is listed
# as "PID COMM" and killed only while that pid still runs that command.
if [[ -f "${DEV}/children" ]]; then
	while read -r cpid comm; do
		if [[ -n "${cpid}" && "$(cat "/proc/${cpid}/comm" 2>/dev/null)" == "${comm}" ]]; then
			kill -KILL "${cpid}" 2>/dev/null || true
		fi
	done <"${DEV}/children"
fi
rm -f "${pidfile}" "${DEV}/ready" "${DEV}/children"
echo "dev-down: stopped"

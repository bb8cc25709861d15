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
# Whatever is left of the process group (etcd, kube-apiserver, manager).
kill -KILL -- "-${pid}" 2>/dev/null || true
rm -f "${pidfile}" "${DEV}/ready"
echo "dev-down: stopped"

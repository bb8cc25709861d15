#!/usr/bin/env bash
# Stops what dev-up started: devcluster, and the control plane and manager it
# started (also when devcluster itself was killed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="${DEV_DIR:-${ROOT}/.dev}"
pidfile="${DEV}/devcluster.pid"
if [[ ! -f "${pidfile}" ]]; then
	echo "dev-down: nothing running (no .dev/devcluster.pid)"
	exit 0
fi
pid="$(cat "${pidfile}")"
# Only while that pid is still devcluster: a pid left from a run that died
# long ago may name another process by now.
if [[ "$(cat "/proc/${pid}/comm" 2>/dev/null)" == "devcluster" ]]; then
	kill -TERM "${pid}" 2>/dev/null || true
	for _ in $(seq 1 60); do
		kill -0 "${pid}" 2>/dev/null || break
		sleep 0.5
	done
	# Whatever is left of its process group.
	kill -KILL -- "-${pid}" 2>/dev/null || true
fi
# etcd, kube-apiserver and the manager run in process groups of their own:
# devcluster stops them itself, unless it was killed first. Each is listed
# as "PID COMM STARTTIME" and killed only while that pid is still that
# process (same name, same start time).
starttime() {
	local s
	s="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
	s="${s##*) }"
	# shellcheck disable=SC2086
	set -- ${s}
	echo "${20}"
}
if [[ -f "${DEV}/children" ]]; then
	while read -r cpid comm started; do
		if [[ -n "${cpid}" && "$(cat "/proc/${cpid}/comm" 2>/dev/null)" == "${comm}" && "$(starttime "${cpid}")" == "${started}" ]]; then
			kill -KILL "${cpid}" 2>/dev/null || true
		fi
	done <"${DEV}/children"
fi
rm -f "${pidfile}" "${DEV}/ready" "${DEV}/children"
echo "dev-down: stopped"

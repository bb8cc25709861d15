#!/usr/bin/env bash
# make demo / make demo-leader: runs hack/demo (or hack/$1) against the local
# control plane of `make dev-up`, starting it first (and stopping it
# afterwards) when it is not running.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
demo="${1:-demo}"
shift || true
started=""
if [[ ! -f .dev/ready ]] || ! bin/kubectl --kubeconfig .dev/kubeconfig get --raw /readyz >/dev/null 2>&1; then
	make --no-print-directory dev-up
	started=yes
fi
cleanup() { if [[ -n "${started}" ]]; then make --no-print-directory dev-down; fi; }
trap cleanup EXIT
go build -o "bin/${demo}" "./hack/${demo}"
"bin/${demo}" --kubeconfig .dev/kubeconfig "$@"

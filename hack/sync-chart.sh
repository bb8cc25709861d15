#!/usr/bin/env bash
# Copies the generated manifests the chart renders from (CRDs, RBAC rules,
# the lease-guard policy) into charts/fencekeeper/files. Run by
# `make manifests`; `make verify-gen` fails when the copies are stale.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
F="${ROOT}/charts/fencekeeper/files"
rm -rf "${F}/crds" "${F}/rbac" "${F}/policy"
mkdir -p "${F}/crds" "${F}/rbac" "${F}/policy"
cp "${ROOT}"/config/crd/bases/*.yaml "${F}/crds/"
cp "${ROOT}/config/rbac/role.yaml" "${F}/rbac/role.yaml"
cp "${ROOT}/config/policy/managed-lease-guard.yaml" "${F}/policy/managed-lease-guard.yaml"
cp "${ROOT}/config/policy/claim-identity.yaml" "${F}/policy/claim-identity.yaml"
cp "${ROOT}/config/policy/claim-break.yaml" "${F}/policy/claim-break.yaml"

// Package podlease is the pod bridge (docs/design.md §4): a pod asks for a
// lock with the fencekeeper.io/lease annotation; the Reconciler makes a claim
// owned by the pod and reports the claim back on the pod (annotations for a
// downward-API volume, and a condition usable as a readiness gate). Whether
// the lease stays alive is the lock authority's business (controllers/lock):
// it reads the pod's readiness instead of waiting for renewals, so a held pod
// lease costs no periodic writes.
package podlease

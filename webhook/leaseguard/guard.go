// Package leaseguard states, in Go, the rules of the managed-Lease
// ValidatingAdmissionPolicy (config/policy/managed-lease-guard.yaml): only the
// manager may rewrite or delete a managed Lease; anyone else may only advance
// renewTime while the Lease names a holder and the holder stays the same.
//
// The policy is what the apiserver enforces; this function exists so the
// rules are documented in code and a test can run both on the same cases
// and fail if they drift apart.
package leaseguard

import (
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Operation is UPDATE or DELETE (the policy does not look at CREATE).
type Operation string

// Operations.
const (
	Update Operation = "UPDATE"
	Delete Operation = "DELETE"
)

// Check returns nil when the write is allowed, else the policy's message.
// newLease is nil for DELETE.
func Check(op Operation, isManager bool, old, newLease *coordinationv1.Lease) error {
	managed := old.Labels[fkv1.LabelManagedBy] == fkv1.ManagedByValue ||
		(newLease != nil && newLease.Labels[fkv1.LabelManagedBy] == fkv1.ManagedByValue)
	if !managed || isManager {
		return nil
	}
	if op == Delete {
		return fmt.Errorf("only the fencekeeper manager may delete managed Lease %s: it holds the epoch counter of its lock", old.Name)
	}
	o, n := old.Spec, newLease.Spec
	switch {
	case ptr.Deref(n.HolderIdentity, "") != ptr.Deref(o.HolderIdentity, ""):
		return fmt.Errorf("only the fencekeeper manager may change the holder of a managed Lease")
	case !equalMaps(newLease.Annotations, old.Annotations):
		return fmt.Errorf("only the fencekeeper manager may change the annotations (epoch, claim) of a managed Lease")
	case !equalMaps(newLease.Labels, old.Labels):
		return fmt.Errorf("only the fencekeeper manager may change the labels of a managed Lease")
	case !equality.Semantic.DeepEqual(emptyIfNil(newLease.Finalizers), emptyIfNil(old.Finalizers)):
		return fmt.Errorf("only the fencekeeper manager may change the finalizers of a managed Lease")
	case !equality.Semantic.DeepEqual(n.LeaseDurationSeconds, o.LeaseDurationSeconds) ||
		!equality.Semantic.DeepEqual(n.AcquireTime, o.AcquireTime) ||
		!equality.Semantic.DeepEqual(n.LeaseTransitions, o.LeaseTransitions) ||
		!equality.Semantic.DeepEqual(n.Strategy, o.Strategy) ||
		!equality.Semantic.DeepEqual(n.PreferredHolder, o.PreferredHolder):
		return fmt.Errorf("only the fencekeeper manager may change a managed Lease's spec other than renewTime")
	case ptr.Deref(o.HolderIdentity, "") == "" || n.RenewTime == nil ||
		(o.RenewTime != nil && !n.RenewTime.After(o.RenewTime.Time)):
		return fmt.Errorf("a holder may only advance renewTime of a managed Lease that names a holder")
	}
	return nil
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func emptyIfNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

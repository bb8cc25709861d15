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

// Operation is CREATE, UPDATE or DELETE.
type Operation string

// Operations.
const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
	Delete Operation = "DELETE"
)

// Request is one write to a Lease as the policy sees it.
type Request struct {
	Op Operation
	// IsManager is true when the manager's identity sends it.
	IsManager bool
	// NamespaceTerminating is true when the Lease's namespace is being deleted.
	NamespaceTerminating bool
	// Old is nil on CREATE, New nil on DELETE.
	Old, New *coordinationv1.Lease
}

// Check returns nil when the write is allowed, else the policy's message.
func Check(r Request) error {
	old, newLease := r.Old, r.New
	managed := (old != nil && old.Labels[fkv1.LabelManagedBy] == fkv1.ManagedByValue) ||
		(newLease != nil && newLease.Labels[fkv1.LabelManagedBy] == fkv1.ManagedByValue)
	if !managed || r.IsManager {
		return nil
	}
	switch r.Op {
	case Create:
		return fmt.Errorf("only the fencekeeper manager may create a managed Lease (%s): a ledger minted by anyone else could name any holder and epoch", newLease.Name)
	case Delete:
		if r.NamespaceTerminating {
			return nil
		}
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

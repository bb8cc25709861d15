// Package leaseguard states, in Go, the rules of the managed-Lease
// ValidatingAdmissionPolicy (config/policy/managed-lease-guard.yaml): only the
// manager may create, rewrite or delete a managed Lease (its holder, epoch,
// labels, annotations, finalizers, ownerReferences and spec); anyone else may
// only advance renewTime while the Lease names a holder and the holder stays
// the same, and only as the holder's bound identity the Lease records
// (fencekeeper.io/holder-user and, if set, fencekeeper.io/holder-pod-uid). A
// Lease that records no holder user is renewed by nobody but the manager.
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
	// User is the request's user name, and PodUID the pod its
	// ServiceAccount token is bound to ("" if none; see
	// webhook/fencing.PodUIDOf).
	User, PodUID string
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
	case !equality.Semantic.DeepEqual(emptyIfNil(newLease.OwnerReferences), emptyIfNil(old.OwnerReferences)):
		// An owner decides when the garbage collector deletes the Lease.
		return fmt.Errorf("only the fencekeeper manager may add, remove or change the ownerReferences of a managed Lease: an owner decides when the garbage collector deletes it")
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
	return checkRenewer(r)
}

// checkRenewer: a renewal comes from the holder's bound identity as the Lease
// records it, else from nobody but the manager.
func checkRenewer(r Request) error {
	user := r.Old.Annotations[fkv1.AnnotationHolderUser]
	podUID := r.Old.Annotations[fkv1.AnnotationHolderPodUID]
	if user == "" {
		return fmt.Errorf("only the fencekeeper manager may renew managed Lease %s: it records no holder user (%s), "+
			"so no identity is bound to renew it (a pod's hold, or one granted before identity binding)", r.Old.Name, fkv1.AnnotationHolderUser)
	}
	if r.User == user && (podUID == "" || podUID == r.PodUID) {
		return nil
	}
	bound := fmt.Sprintf("user %q", user)
	if podUID != "" {
		bound += " with a token bound to pod " + podUID
	}
	sender := fmt.Sprintf("user %q", r.User)
	if r.PodUID != "" {
		sender += " with a token bound to pod " + r.PodUID
	}
	return fmt.Errorf("only the holder's bound identity may renew managed Lease %s (%s), but this request comes from %s", r.Old.Name, bound, sender)
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

func emptyIfNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

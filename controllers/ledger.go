package controllers

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhook/fencing"
)

// ledger is what the backing Lease says about its lock: the last issued epoch,
// the holder claim and the claim before it.
type ledger struct {
	epoch        int64
	epochValid   bool // false when the epoch annotation is missing or malformed
	holderName   string
	holderUID    types.UID
	previousUID  types.UID
	managedFully bool // labels and finalizer present
}

// parseEpoch parses the Lease's counter: the fencing grammar of
// fencing.ParseEpoch, plus 0 for a Lease that never granted.
func parseEpoch(s string) (int64, error) {
	if s == "0" {
		return 0, nil
	}
	return fencing.ParseEpoch(s)
}

func readLedger(lease *coordinationv1.Lease, lockName string) ledger {
	if lease == nil {
		return ledger{epochValid: true}
	}
	l := ledger{
		holderName:  lease.Annotations[fkv1.AnnotationClaim],
		holderUID:   types.UID(lease.Annotations[fkv1.AnnotationClaimUID]),
		previousUID: types.UID(lease.Annotations[fkv1.AnnotationPreviousClaimUID]),
	}
	if v, ok := lease.Annotations[fkv1.AnnotationEpoch]; ok {
		if e, err := parseEpoch(v); err == nil {
			l.epoch, l.epochValid = e, true
		}
	}
	l.managedFully = lease.Labels[fkv1.LabelManagedBy] == fkv1.ManagedByValue &&
		lease.Labels[fkv1.LabelLock] == lockName && hasFinalizer(lease, fkv1.LeaseFinalizer)
	return l
}

func isManaged(lease *coordinationv1.Lease) bool {
	return lease.Labels[fkv1.LabelManagedBy] == fkv1.ManagedByValue
}

func hasFinalizer(lease *coordinationv1.Lease, f string) bool {
	for _, x := range lease.Finalizers {
		if x == f {
			return true
		}
	}
	return false
}

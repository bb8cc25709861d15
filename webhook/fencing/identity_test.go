package fencing

import (
	"strings"
	"testing"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestCheckIdentity(t *testing.T) {
	alice := Binding{User: "alice", Known: true}
	pod := Binding{PodUID: "pod-a", Known: true}
	both := Binding{User: "system:serviceaccount:reports:worker", PodUID: "pod-a", Known: true}
	cases := []struct {
		name  string
		bound Binding
		who   Identity
		allow bool
	}{
		{"the creator", alice, Identity{User: "alice"}, true},
		{"another user", alice, Identity{User: "mallory"}, false},
		{"the creator from any pod", alice, Identity{User: "alice", PodUID: "pod-b"}, true},
		{"a token bound to the pod", pod, Identity{User: "system:serviceaccount:reports:worker", PodUID: "pod-a"}, true},
		{"a token bound to another pod", pod, Identity{User: "system:serviceaccount:reports:worker", PodUID: "pod-b"}, false},
		{"no pod token", pod, Identity{User: "admin"}, false},
		{"user and pod both must match", both, Identity{User: "system:serviceaccount:reports:other", PodUID: "pod-a"}, false},
		{"user and pod both match", both, Identity{User: "system:serviceaccount:reports:worker", PodUID: "pod-a"}, true},
		{"a claim that records no identity: not anyone", Binding{Known: true}, Identity{User: "anyone"}, false},
		{"a claim that records no identity: not even a pod-bound token", Binding{Known: true}, Identity{User: "system:serviceaccount:reports:worker", PodUID: "pod-a"}, false},
		{"the claim that held the epoch is gone", Binding{}, Identity{User: "alice"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := CheckIdentity(heldBy42, 42, tc.who, tc.bound)
			if d.Allowed != tc.allow {
				t.Fatalf("allowed = %v, want %v (%s)", d.Allowed, tc.allow, d.Message)
			}
			if !d.Allowed && (d.Reason != fkv1.AdmissionIdentityMismatch || d.Code != 403) {
				t.Errorf("denial %s/%d, want IdentityMismatch/403", d.Reason, d.Code)
			}
			if unbound := tc.bound.Known && tc.bound.User == "" && tc.bound.PodUID == ""; unbound && !strings.Contains(d.Message, "records no identity") {
				t.Errorf("the refusal of an epoch whose claim records no identity does not say so: %s", d.Message)
			}
		})
	}
}

func TestNeedsIdentity(t *testing.T) {
	accepted := Decision{Allowed: true, Reason: fkv1.AdmissionEpochAccepted, Epoch: 42}
	optOut := withAnnotation(fkv1.AnnotationFenceIdentity, fkv1.FenceIdentityAny)
	if _, need := NeedsIdentity(update(stored("v1", "42"), write(stored("v1", "42"), "v2", "42")), accepted); !need {
		t.Error("an accepted content write is not identity-checked")
	}
	if _, need := NeedsIdentity(update(stored("v1", "42", optOut), write(stored("v1", "42", optOut), "v2", "42")), accepted); need {
		t.Error("the stored object's opt-out is ignored")
	}
	if _, need := NeedsIdentity(update(stored("v1", "42"), write(stored("v1", "42"), "v2", "42", optOut)), accepted); !need {
		t.Error("a write opted itself out")
	}
	unfenced := stored("v1", "-", withLabel(lockLabel, "<none>"), optOut)
	if _, need := NeedsIdentity(update(unfenced, write(stored("v1", "-"), "v2", "42")), accepted); !need {
		t.Error("the write that fences an object was opted out by what the object carried unfenced")
	}
	if _, need := NeedsIdentity(create(write(nil, "v1", "42", optOut)), accepted); !need {
		t.Error("a create opted itself out")
	}
	if _, need := NeedsIdentity(update(stored("v1", "42"), stored("v1", "42")), Decision{Allowed: true, Reason: fkv1.AdmissionMetadataOnly}); need {
		t.Error("metadata-only maintenance is identity-checked")
	}
	if _, need := NeedsIdentity(del(stored("v1", "42")), Decision{Allowed: true, Reason: fkv1.AdmissionDeleteMarked, Epoch: 42}); !need {
		t.Error("a marked delete is not identity-checked")
	}
}

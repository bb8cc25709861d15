package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// refusing is an apiserver's reply to writes, no API behind it: the first
// refusals writes are refused with reason, then they are accepted.
type refusing struct {
	client.Client
	reason   fkv1.AdmissionReason
	refusals int
	sent     int
}

func (r *refusing) reply() error {
	r.sent++
	if r.sent > r.refusals {
		return nil
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden, Message: "refused",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseType(fkv1.Prefix + string(r.reason))}}},
	}}
}

func (r *refusing) Update(context.Context, client.Object, ...client.UpdateOption) error {
	return r.reply()
}

func (r *refusing) Create(context.Context, client.Object, ...client.CreateOption) error {
	return r.reply()
}

func (r *refusing) Patch(context.Context, client.Object, client.Patch, ...client.PatchOption) error {
	return r.reply()
}

// A write refused FutureEpoch right after the grant (CEL mode's parameter
// cache not yet showing it) is sent again until accepted; any other
// refusal, and a FutureEpoch refusal long after the grant, is returned at
// once.
func TestFutureEpochIsRetriedOnlyRightAfterTheGrant(t *testing.T) {
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "report-2026-07"}}
	writes := map[string]func(*Lease, client.Client) error{
		"update": func(l *Lease, c client.Client) error { return l.Update(ctx, c, cm) },
		"create": func(l *Lease, c client.Client) error { return l.Create(ctx, c, cm) },
		"patch":  func(l *Lease, c client.Client) error { return l.Patch(ctx, c, cm, client.MergeFrom(cm.DeepCopy())) },
	}
	for name, write := range writes {
		t.Run(name, func(t *testing.T) {
			l := heldLease()
			l.grantedAt = time.Now()
			c := &refusing{reason: fkv1.AdmissionFutureEpoch, refusals: 3}
			if err := write(l, c); err != nil || c.sent != 4 {
				t.Fatalf("just granted, 3 FutureEpoch refusals: err %v after %d sends, want accepted on the 4th", err, c.sent)
			}

			stale := &refusing{reason: fkv1.AdmissionStaleEpoch, refusals: 3}
			if err := write(l, stale); !errors.Is(err, ErrStaleEpoch) || stale.sent != 1 {
				t.Fatalf("a stale refusal: err %v after %d sends, want ErrStaleEpoch after 1", err, stale.sent)
			}

			l.grantedAt = time.Now().Add(-FutureEpochWait)
			late := &refusing{reason: fkv1.AdmissionFutureEpoch, refusals: 3}
			if err := write(l, late); FencingReason(err) != fkv1.AdmissionFutureEpoch || late.sent != 1 {
				t.Fatalf("FutureEpoch %v after the grant: err %v after %d sends, want it returned after 1", FutureEpochWait, err, late.sent)
			}

			l.grantedAt = time.Now()
			l.cancel() // lost
			lost := &refusing{reason: fkv1.AdmissionFutureEpoch, refusals: 3}
			if err := write(l, lost); err == nil || lost.sent != 1 {
				t.Fatalf("a lost lease: err %v after %d sends, want the refusal after 1", err, lost.sent)
			}
		})
	}
}

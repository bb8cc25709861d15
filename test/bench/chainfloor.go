// The chain floor for throughput: the requests of a grant cycle on an
// existing lock (claim create, RV-guarded Lease update, claim status patch
// guarded by the claim's resourceVersion, claim delete), replayed by the
// bench itself at the throughput phase's concurrency, with no authority
// acting on them. The claims are stand-ins the manager never sees: objects
// of a copy of the FencedLease CRD under another API group
// (chainfloor.fencekeeper.io: same schema, validation rules and status
// subresource, so the apiserver does the same work for them), and each
// worker's Lease is a plain one without fencekeeper's label (the manager
// watches only its own). grants_per_s over this is what the authority adds.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lease"
	"github.com/fencekeeper/fencekeeper/test/envtestutil"
)

const standInGroup = "chainfloor.fencekeeper.io"

// chainFloor: `cycles` grant cycles' requests by conc workers, each on a
// Lease of its own; cycles per second. withEvents adds the two Events a
// grant cycle records (Granted and Released, as the authority's recorder
// creates them): a diagnostic of what they cost, not the floor.
func chainFloor(ctx context.Context, cfg *rest.Config, cycles, conc int, withEvents bool) (float64, error) {
	if err := installStandInCRD(cfg); err != nil {
		return 0, err
	}
	c, err := client.New(cfg, client.Options{Scheme: lease.Scheme()})
	if err != nil {
		return 0, err
	}
	ns, err := newNS(ctx, c, "chainfloor")
	if err != nil {
		return 0, err
	}
	leases := make([]*coordinationv1.Lease, conc)
	for w := range leases {
		leases[w] = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lock-" + strconv.Itoa(w)}}
		if err := c.Create(ctx, leases[w]); err != nil {
			return 0, err
		}
	}
	epoch := make([]int64, conc)
	cycle := func(w, j int) error {
		name := fmt.Sprintf("w%d-%d", w, j)
		u, err := standIn(claim(ns, name, leases[w].Name, 3600))
		if err != nil {
			return err
		}
		if err := c.Create(ctx, u); err != nil {
			return err
		}
		l := leases[w]
		now := metav1.NewMicroTime(time.Now())
		epoch[w]++
		l.Spec.HolderIdentity, l.Spec.RenewTime, l.Spec.AcquireTime = ptr.To(name), &now, &now
		l.Spec.LeaseTransitions = ptr.To(int32(epoch[w]))
		if err := c.Update(ctx, l); err != nil { // carries l.ResourceVersion
			return err
		}
		t := metav1.NewTime(now.Time)
		status := fkv1.FencedLeaseStatus{Phase: fkv1.PhaseHeld, Epoch: epoch[w], LeaseName: l.Name, AcquireTime: &t, RenewTime: &t,
			ExpireTime: ptr.To(metav1.NewTime(t.Add(time.Hour))), ObservedGeneration: u.GetGeneration(),
			Conditions: []metav1.Condition{{Type: fkv1.ConditionHeld, Status: metav1.ConditionTrue, Reason: fkv1.ReasonGranted,
				Message: fmt.Sprintf("Holds lock %s with epoch %d", l.Name, epoch[w]), LastTransitionTime: t, ObservedGeneration: u.GetGeneration()}}}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": u.GetResourceVersion()}, "status": status})
		if err != nil {
			return err
		}
		if err := c.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return err
		}
		if withEvents {
			if err := c.Create(ctx, standInEvent(u, fkv1.ReasonGranted)); err != nil {
				return err
			}
		}
		if err := c.Delete(ctx, u); err != nil {
			return err
		}
		if withEvents {
			return c.Create(ctx, standInEvent(u, fkv1.ReasonReleased))
		}
		return nil
	}
	if err := workers(conc, func(w int) error { return cycle(w, 0) }); err != nil { // warm-up
		return 0, err
	}
	return timedCycles(cycles, conc, cycle)
}

// standIn is the claim as an object of the stand-in CRD.
// standInEvent is an Event about u as the authority records one on a claim
// (events.k8s.io/v1, as controller-runtime's recorder writes it).
func standInEvent(u *unstructured.Unstructured, reason string) *eventsv1.Event {
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: u.GetNamespace(), Name: u.GetName() + "." + strings.ToLower(reason)},
		EventTime:  metav1.NewMicroTime(time.Now()), Type: corev1.EventTypeNormal, Reason: reason, Action: "Grant",
		Note:                "Holds lock " + u.GetName() + " with epoch 1",
		ReportingController: "fencekeeper.io/chainfloor", ReportingInstance: "bench",
		Regarding: corev1.ObjectReference{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID()},
	}
}

func standIn(cl *fkv1.FencedLease) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cl)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(standInGroup + "/" + fkv1.GroupVersion.Version)
	u.SetKind("FencedLease")
	return u, nil
}

// installStandInCRD installs the FencedLease CRD, as the repo builds it,
// under standInGroup, and waits until it is served.
func installStandInCRD(cfg *rest.Config) error {
	b, err := os.ReadFile(filepath.Join(envtestutil.RepoRoot(), "config", "crd", "bases", "fencekeeper.io_fencedleases.yaml"))
	if err != nil {
		return err
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		return err
	}
	crd.Spec.Group = standInGroup
	crd.Name = crd.Spec.Names.Plural + "." + standInGroup
	_, err = envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{&crd}})
	return err
}

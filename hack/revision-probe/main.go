// Command revision-probe measures how long a consistent LIST of one item
// takes right after a write, per resource: the read a new ledger makes for
// its storage revision (docs/performance.md, "Levers checked"). It needs a
// control plane with fencekeeper's CRD (make dev-up) and KUBECONFIG; it
// leaves its ConfigMaps and claims in the namespace "default".
//
//	KUBECONFIG=.dev/kubeconfig go run ./hack/revision-probe
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		panic(err)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	cs := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ctx := context.Background()
	fl := schema.GroupVersionResource{Group: "fencekeeper.io", Version: "v1alpha1", Resource: "fencedleases"}
	ns := "default"
	measure := func(name string, write func(i int), read func() string) {
		var d []time.Duration
		for i := 0; i < 30; i++ {
			write(i)
			t := time.Now()
			_ = read()
			d = append(d, time.Since(t))
			time.Sleep(20 * time.Millisecond)
		}
		sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
		fmt.Printf("%-55s p50 %6.1f ms  p90 %6.1f ms\n", name, float64(d[15])/1e6, float64(d[27])/1e6)
	}
	readLeases := func() string {
		l, err := cs.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			panic(err)
		}
		return l.ResourceVersion
	}
	readClaims := func() string {
		l, err := dyn.Resource(fl).Namespace("").List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			panic(err)
		}
		return l.GetResourceVersion()
	}
	writeCM := func(i int) {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}}, metav1.CreateOptions{})
		if err != nil {
			panic(err)
		}
	}
	writeClaim := func(i int) {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "fencekeeper.io/v1alpha1", "kind": "FencedLease",
			"metadata": map[string]any{"generateName": "probe-"},
			"spec":     map[string]any{"lockName": fmt.Sprintf("probe-%d-%d", time.Now().UnixNano(), i), "holderIdentity": "probe", "leaseDurationSeconds": int64(30)},
		}}
		if _, err := dyn.Resource(fl).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			panic(err)
		}
	}
	measure("leases LIST after a ConfigMap create", writeCM, readLeases)
	measure("fencedleases LIST after a ConfigMap create", writeCM, readClaims)
	measure("leases LIST after a FencedLease create", writeClaim, readLeases)
	measure("fencedleases LIST after a FencedLease create", writeClaim, readClaims)
	measure("leases LIST, nothing written since", func(int) {}, readLeases)
}

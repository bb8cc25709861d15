package main

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
)

// certOptions configure the webhook serving certificate the manager keeps
// for itself (cert-controller): a CA and serving certificate in a Secret,
// rotated before expiry, with the CA injected into the webhook configuration.
type certOptions struct {
	enabled                                   bool
	namespace, secret, service, webhookConfig string
	certDir                                   string
}

// setupCertRotation adds the rotator; the returned channel closes once the
// certificate is on disk and the caBundle is injected.
func setupCertRotation(mgr ctrl.Manager, o certOptions) (chan struct{}, error) {
	ready := make(chan struct{})
	if !o.enabled {
		close(ready)
		return ready, nil
	}
	if o.namespace == "" {
		return nil, errors.New("--cert-rotation needs the manager's namespace: set POD_NAMESPACE or --cert-namespace")
	}
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: o.namespace, Name: o.secret},
		CertDir:        o.certDir,
		CAName:         "fencekeeper-ca",
		CAOrganization: "fencekeeper",
		DNSName:        fmt.Sprintf("%s.%s.svc", o.service, o.namespace),
		ExtraDNSNames:  []string{fmt.Sprintf("%s.%s.svc.cluster.local", o.service, o.namespace)},
		IsReady:        ready,
		Webhooks:       []rotator.WebhookInfo{{Name: o.webhookConfig, Type: rotator.Mutating}},
		// Every replica serves the webhook, so every replica needs the files;
		// the Secret and caBundle writes are guarded by resourceVersion.
		RequireLeaderElection: false,
	}); err != nil {
		return nil, err
	}
	return ready, nil
}

// readyAfter fails readiness until ready is closed, then delegates.
func readyAfter(ready chan struct{}, next func(*http.Request) error) func(*http.Request) error {
	return func(r *http.Request) error {
		select {
		case <-ready:
			return next(r)
		default:
			return errors.New("webhook certificate not ready yet")
		}
	}
}

package webhook

import (
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// SetupWithManager serves the fencing webhook on the manager's webhook server.
// It reads Leases through the manager's cache, which the lock controller
// already keeps (managed Leases only), so it adds no informer of its own;
// authority (nil on a process that does not run the lock controller) shows
// that cache fresh.
func SetupWithManager(mgr ctrl.Manager, authority Authority) {
	mgr.GetWebhookServer().Register(FencingPath, &webhook.Admission{Handler: &FencingHandler{
		Cache:     mgr.GetCache(),
		APIReader: mgr.GetAPIReader(),
		Authority: authority,
		Mapper:    mgr.GetRESTMapper(),
	}})
}

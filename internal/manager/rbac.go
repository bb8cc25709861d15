package manager

// RBAC the manager needs besides its controllers': the fencing webhook reads
// managed Leases (already granted above) and the namespace of a fenced
// object being deleted, and the webhook certificate
// rotator (cmd/manager --cert-rotation) keeps its Secret, in the manager's
// own namespace only, and the caBundle of the webhook configuration.
//
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups="",namespace=fencekeeper-system,resources=secrets,verbs=get;list;watch;create;update;patch

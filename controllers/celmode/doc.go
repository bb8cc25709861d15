// Package celmode holds the manager's controllers for the CEL enforcement
// mode (docs/design.md §3), whose admission policies and bindings
// webhook/celmode renders and applies: PoliciesReconciler and
// BindingReconciler run in CEL mode, CleanupReconciler in webhook mode.
//
// # Policies
//
// PoliciesReconciler keeps the CEL enforcement mode's admission policies
// (webhook/celmode: the fencing, lease-required and base policies, and the
// base binding) applied while the manager runs in CEL mode. The per-lock
// bindings (BindingReconciler) select these policies by name, and a
// binding whose policy is gone is ignored by the apiserver: a policy
// deleted (by hand, or by a webhook-mode replica's cleanup still running
// during a switch to CEL mode) would leave every lock unfenced until the
// next leader applied it again. So each of them is watched, and any change
// or deletion applies them all again, in their order (the validating ones
// before the mutating one).
//
// # Bindings
//
// BindingReconciler keeps the CEL enforcement mode's per-lock admission
// policy bindings in line with the locks that exist (docs/design.md §3,
// webhook/celmode): a lock name gets its MutatingAdmissionPolicyBinding and
// its two ValidatingAdmissionPolicyBindings (fencing and lease-required) as
// soon as a claim or a managed Lease names it, and loses them when neither
// does anywhere in the cluster.
//
// The validating bindings are created first and the mutating one only once
// every apiserver instance (each endpoint of the kubernetes Service) proves
// the fencing binding in force by refusing a dry-run write as it must
// (celmode.EnsureBindings); removal goes the other way (celmode.
// RemoveBindings). A mutating binding alone would consume tokens that
// nothing checks. No step here compares clocks: until the proof comes, the
// lock is reconciled again after a short, growing delay, and presented
// epochs of the lock are refused (nothing consumes them), so a new lock
// name's first writes wait about a second.
//
// # Cleanup
//
// CleanupReconciler removes, in webhook mode, the admission policies and
// bindings the CEL enforcement mode applied (webhook/celmode), which a
// switch from CEL mode to webhook mode leaves behind (the manager applied
// them, not Helm). Left in place, the mutating policy would consume each
// fenced write's token before the webhook sees it, and the webhook would
// refuse every such write as presenting none.
//
// It watches the four admission-policy kinds (the manager's cache holds
// only fencekeeper's) and deletes what celmode.Owned names, whenever one
// appears: a CEL-mode replica still running during the rollout may apply
// them again until it stops.
//
// In this package's files, the identifier celmode names the imported
// webhook/celmode (the policies themselves), never this package.
package celmode

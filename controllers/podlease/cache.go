package podlease

import "github.com/fencekeeper/fencekeeper/controllers/internal/pods"

// StripPod is the pod informer's cache transform (the manager's cache
// options): it keeps only what the pod bridge and the lock authority
// decide on, a few hundred bytes per pod instead of the whole object.
func StripPod(obj any) (any, error) { return pods.Strip(obj) }

// StripNode is the node informer's cache transform: it keeps only a node's
// name and Ready condition.
func StripNode(obj any) (any, error) { return pods.StripNode(obj) }

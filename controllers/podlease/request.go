package podlease

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	fkv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// request is what a pod asks for with its annotations.
type request struct {
	lock string
	ttl  int32
	// maxHolders is the lock's capacity (fencekeeper.io/lease-max-holders;
	// 1, a mutex, when absent).
	maxHolders int32
}

// leaseRequest reads and validates the pod's annotations. invalid names
// every problem found, not just the first.
func leaseRequest(pod *corev1.Pod) (req request, invalid string) {
	lock, ttl, invalid := leaseLockAndTTL(pod)
	req = request{lock: lock, ttl: ttl, maxHolders: 1}
	if lock == "" {
		return req, ""
	}
	var problems []string
	if invalid != "" {
		problems = append(problems, invalid)
	}
	if v, ok := pod.Annotations[fkv1.AnnotationLeaseMaxHolders]; ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 || n > fkv1.MaxMaxHolders {
			problems = append(problems, fmt.Sprintf("annotation %s=%q must be a whole number in 1..%d (1: a mutex, more: a semaphore)",
				fkv1.AnnotationLeaseMaxHolders, v, fkv1.MaxMaxHolders))
		}
		req.maxHolders = int32(n)
	}
	if len(problems) > 0 {
		return request{lock: lock}, strings.Join(problems, "; ")
	}
	return req, ""
}

// leaseLockAndTTL reads and validates the lock and TTL annotations.
func leaseLockAndTTL(pod *corev1.Pod) (lock string, ttl int32, invalid string) {
	lock = pod.Annotations[fkv1.AnnotationLease]
	if lock == "" {
		return "", 0, ""
	}
	var problems []string
	if errs := validation.IsDNS1123Subdomain(lock); len(errs) > 0 || len(lock) > 63 {
		problems = append(problems, fmt.Sprintf("annotation %s=%q is not a valid lock name: a DNS-1123 subdomain of at most 63 characters", fkv1.AnnotationLease, lock))
	}
	ttl = fkv1.DefaultLeaseDurationSeconds
	if v, ok := pod.Annotations[fkv1.AnnotationLeaseDuration]; ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 || n > 86400 {
			problems = append(problems, fmt.Sprintf("annotation %s=%q must be a whole number of seconds in 1..86400", fkv1.AnnotationLeaseDuration, v))
		}
		ttl = int32(n)
	}
	if len(problems) > 0 {
		return lock, 0, strings.Join(problems, "; ")
	}
	return lock, ttl, ""
}

// PodClaimName is the deterministic claim name for a pod and lock: valid for
// any pod name (up to 253 characters) and lock name.
func PodClaimName(pod *corev1.Pod, lock string) string { return podClaimName(pod, lock, 1) }

// podClaimName is the claim name for a pod, lock and capacity: a mutex's
// is PodClaimName's; a semaphore's hash includes the capacity too, so a
// pod whose request changes capacity (immutable on a claim) gets a claim of
// another name, not one that must wait for the old one's deletion.
func podClaimName(pod *corev1.Pod, lock string, maxHolders int32) string {
	key := string(pod.UID) + "/" + lock
	if maxHolders > 1 {
		key += "/" + strconv.Itoa(int(maxHolders))
	}
	sum := sha256.Sum256([]byte(key))
	base := pod.Name
	if len(base) > 200 {
		base = base[:200]
	}
	base = strings.TrimRight(base, "-.")
	return base + "-" + hex.EncodeToString(sum[:])[:10]
}

// Package v1alpha1 contains the fencekeeper.io/v1alpha1 API: FencedLease, one
// holder's claim on a named lock.
//
// +kubebuilder:object:generate=true
// +groupName=fencekeeper.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "fencekeeper.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &FencedLease{}, &FencedLeaseList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

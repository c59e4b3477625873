package v1alpha1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AddressBlock is one block of a pool, owned by one node: all its
// addresses route to that node. A node claims a block itself by creating
// it: its name is BlockName(pool, index), so the API server's
// create-if-absent is the lock (201: the node owns it; 409: another node
// does). NodeName names the owner and never changes; the labels LabelPool
// and LabelNode repeat the pool and the node for selectors, an owner
// reference points at the pool, and FinalizerBlock keeps it until the node
// has let go of it. A block never changes once made.
//
// Blocks made by the retired BlockRequest protocol have no nodeName (only
// the label): their node adopts them by setting it, once.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=skblock,categories=skein
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.metadata.labels['skein\.dev/pool']`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.nodeName`
// +kubebuilder:printcolumn:name="Index",type=integer,JSONPath=`.index`
// +kubebuilder:printcolumn:name="IPv4",type=string,JSONPath=`.ipv4`
// +kubebuilder:printcolumn:name="IPv6",type=string,JSONPath=`.ipv6`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeName) || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",message="nodeName is immutable once set"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.lastIndexOf('-') > 0 && self.metadata.name.substring(self.metadata.name.lastIndexOf('-') + 1) == string(self.index)",message="the name must be <pool>-<index>"
type AddressBlock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// NodeName is the node that owns the block: the only node that
	// allocates from it and the one its routes lead to. Set at creation
	// (blocks of the BlockRequest protocol: once, by their node) and
	// never changed.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:MinLength=1
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// Index of the block in its pool (see internal/ipam.Geometry).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="index is immutable"
	Index int64 `json:"index"`
	// IPv4 is the block's IPv4 slice in CIDR form, when the pool has IPv4.
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="ipv4 is immutable"
	// +optional
	IPv4 *string `json:"ipv4,omitempty"`
	// IPv6 is the block's IPv6 slice in CIDR form, when the pool has IPv6.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="ipv6 is immutable"
	// +optional
	IPv6 *string `json:"ipv6,omitempty"`
}

// BlockName is the name of block index of pool: "<pool>-<index>".
func BlockName(pool string, index uint32) string {
	return fmt.Sprintf("%s-%d", pool, index)
}

// AddressBlockList is a list of AddressBlocks.
// +kubebuilder:object:root=true
type AddressBlockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddressBlock `json:"items"`
}

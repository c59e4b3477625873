package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AddressPool is a set of subnets carved into blocks that nodes claim
// whole. Block b of a pool covers the b-th 2^blockSizeBits slice of the
// pool's subnets, taken in order; that is why blockSizeBits is immutable
// and subnets may only be appended.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=skpool,categories=skein
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Block bits",type=integer,JSONPath=`.spec.blockSizeBits`
// +kubebuilder:printcolumn:name="Blocks",type=integer,JSONPath=`.status.blocksAllocated`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.blocksTotal`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AddressPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AddressPoolSpec `json:"spec"`
	// +optional
	Status AddressPoolStatus `json:"status,omitempty"`
}

// AddressPoolSpec defines a pool.
type AddressPoolSpec struct {
	// Subnets of the pool, in order. The i-th IPv4 subnet pairs with the
	// i-th IPv6 subnet: a pool is IPv4-only, IPv6-only, or has both
	// families in every entry.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Subnets []SubnetSet `json:"subnets"`

	// BlockSizeBits makes blocks of 2^blockSizeBits addresses per family.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +kubebuilder:default=5
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="blockSizeBits is immutable"
	// +optional
	BlockSizeBits int32 `json:"blockSizeBits,omitempty"`

	// MaxBlocksPerNode caps the blocks of this pool one node may hold, so
	// that one node, broken or compromised, cannot exhaust the pool: a
	// node never claims more, and the AddressBlock webhook refuses more.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	// +kubebuilder:default=16
	// +optional
	MaxBlocksPerNode int32 `json:"maxBlocksPerNode,omitempty"`

	// Reserved lists addresses, CIDRs or "first-last" ranges the pool
	// never hands out.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=100
	// +listType=atomic
	// +optional
	Reserved []string `json:"reserved,omitempty"`
}

// SubnetSet is one entry of a pool's subnets: an IPv4 subnet, an IPv6
// subnet, or one of each.
// +kubebuilder:validation:XValidation:rule="has(self.ipv4) || has(self.ipv6)",message="a subnet needs ipv4, ipv6 or both"
type SubnetSet struct {
	// IPv4 is an IPv4 subnet in CIDR form, without host bits.
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4",message="ipv4 must be an IPv4 CIDR such as 10.64.0.0/16"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="ipv4 has host bits set"
	// +optional
	IPv4 *string `json:"ipv4,omitempty"`
	// IPv6 is an IPv6 subnet in CIDR form, without host bits.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 6",message="ipv6 must be an IPv6 CIDR such as fd00:64::/48"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="ipv6 has host bits set"
	// +optional
	IPv6 *string `json:"ipv6,omitempty"`
}

// AddressPoolStatus is what the controller observed of a pool.
type AddressPoolStatus struct {
	// BlocksAllocated is the number of AddressBlocks of the pool.
	// +optional
	BlocksAllocated int64 `json:"blocksAllocated"`
	// BlocksTotal is the number of blocks the pool's subnets hold.
	// +optional
	BlocksTotal int64 `json:"blocksTotal"`
	// AddressesUsed is the number of addresses in use, when known (nodes
	// keep their attachments locally and may not report them).
	// +optional
	AddressesUsed *int64 `json:"addressesUsed,omitempty"`
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions of the pool.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AddressPoolList is a list of AddressPools.
// +kubebuilder:object:root=true
type AddressPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddressPool `json:"items"`
}

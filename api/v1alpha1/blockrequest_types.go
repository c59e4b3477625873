package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BlockRequest is a node asking for one more block of a pool. The
// controller picks the pool's next free block, records its name in the
// status, makes the AddressBlock and then sets the condition Complete; or
// it sets Failed with a reason (ReasonPoolNotFound, ReasonPoolExhausted,
// ReasonPoolInvalid). The node waits for Complete or Failed, takes the
// block and deletes the request; an owner reference to the node's Node
// object removes it when the node goes.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=skreq,categories=skein
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolName`
// +kubebuilder:printcolumn:name="Block",type=string,JSONPath=`.status.addressBlockName`
// +kubebuilder:printcolumn:name="Complete",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].status`
// +kubebuilder:printcolumn:name="Failed",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Failed")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BlockRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BlockRequestSpec `json:"spec"`
	// +optional
	Status BlockRequestStatus `json:"status,omitempty"`
}

// BlockRequestSpec says who wants a block of which pool.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a block request cannot be changed; delete it and make another"
type BlockRequestSpec struct {
	// NodeName is the node that will own the block.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// PoolName is the AddressPool to carve the block from.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	PoolName string `json:"poolName"`
}

// BlockRequestStatus is the controller's answer.
type BlockRequestStatus struct {
	// AddressBlockName is the AddressBlock carved for the request. The
	// controller writes it before it makes the block (so a retry, or a
	// second controller, makes the same one); the block is there once
	// the condition Complete is true.
	// +optional
	AddressBlockName string `json:"addressBlockName,omitempty"`
	// Conditions: Complete or Failed (with a reason and a message).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types and reasons of a BlockRequest.
const (
	// ConditionComplete is true once the block is carved.
	ConditionComplete = "Complete"
	// ConditionFailed is true when the request cannot be served.
	ConditionFailed = "Failed"

	// ReasonBlockCarved: the block named in status was made for the request.
	ReasonBlockCarved = "BlockCarved"
	// ReasonPoolNotFound: spec.poolName names no AddressPool.
	ReasonPoolNotFound = "PoolNotFound"
	// ReasonPoolExhausted: every block of the pool is taken.
	ReasonPoolExhausted = "PoolExhausted"
	// ReasonPoolInvalid: the pool's definition makes no geometry (a pool
	// the webhook did not see, made while it was down).
	ReasonPoolInvalid = "PoolInvalid"
)

// BlockRequestList is a list of BlockRequests.
// +kubebuilder:object:root=true
type BlockRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BlockRequest `json:"items"`
}

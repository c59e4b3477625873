package cni

import (
	"errors"

	"github.com/containernetworking/cni/pkg/types"
)

// skein's own error codes (the spec reserves 100 and up for plugins).
const (
	// CodePoolExhausted: the pool has no free address for this node.
	CodePoolExhausted uint = 100
	// CodeAddressUnavailable: a requested static address is in use,
	// reserved, or in a block another node owns.
	CodeAddressUnavailable uint = 101
	// CodeAttachmentExists: ADD for a (network, container, ifname) that is
	// already attached; DEL it first.
	CodeAttachmentExists uint = 102
	// CodeNetworkNotAllowed: the pod's namespace may not use a pod
	// network it asked for (the network's allowedNamespaces and
	// namespaceSelector).
	CodeNetworkNotAllowed uint = 103
	// CodeCheckFailed: CHECK found the attachment not as ADD left it.
	CodeCheckFailed uint = 110
	// CodeInternal: anything else.
	CodeInternal uint = 999
)

// Errorf-style helpers returning spec errors.

// NewError returns a spec error.
func NewError(code uint, msg, details string) *types.Error {
	return types.NewError(code, msg, details)
}

// AsError returns err as a spec error, keeping its code if it has one.
func AsError(err error) *types.Error {
	if err == nil {
		return nil
	}
	var e *types.Error
	if errors.As(err, &e) {
		return e
	}
	return types.NewError(CodeInternal, err.Error(), "")
}

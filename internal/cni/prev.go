package cni

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// CheckPrevResult refuses a decoded prevResult with a null interface, IP
// or route (code that reads the result follows those pointers), or with an
// IP without an address or a route without a destination (the CNI library
// decodes those as empty and encodes them as "<nil>", so a result built on
// them would reach the runtime unreadable).
func CheckPrevResult(prev types.Result) error {
	if prev == nil {
		return nil
	}
	r, err := current.NewResultFromResult(prev)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
	}
	for i, ifc := range r.Interfaces {
		if ifc == nil {
			return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult: interfaces[%d] is null", i), "")
		}
	}
	for i, ip := range r.IPs {
		if ip == nil || ip.Address.IP == nil || ip.Address.Mask == nil {
			return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult: ips[%d] has no address", i), "")
		}
	}
	for i, rt := range r.Routes {
		if rt == nil || rt.Dst.IP == nil || rt.Dst.Mask == nil {
			return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("prevResult: routes[%d] has no dst", i), "")
		}
	}
	return nil
}

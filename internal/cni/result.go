package cni

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Attached describes what skeind plumbed for one ADD.
type Attached struct {
	HostName     string
	HostMAC      string
	IfName       string
	ContainerMAC string
	Sandbox      string // the netns path
	Addrs        []netip.Addr
	GatewayV4    netip.Addr
	GatewayV6    netip.Addr
}

// BuildResult makes the ADD result: skein's interfaces, addresses and
// default routes, appended to prevResult when skein runs chained after
// another plugin. The result's version is the configuration's.
//
// A 0.1.0 or 0.2.0 result holds one address per family and no
// interfaces, so of a chain's addresses only the first of each family
// survives the conversion: there skein's own addresses go first, since
// they are what CNI_IFNAME carries.
func BuildResult(c *NetConf, a Attached) (types.Result, error) {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if c.PrevResult != nil {
		prev, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
		}
		res = prev
	}
	host := len(res.Interfaces)
	res.Interfaces = append(res.Interfaces,
		&current.Interface{Name: a.HostName, Mac: a.HostMAC},
		&current.Interface{Name: a.IfName, Mac: a.ContainerMAC, Sandbox: a.Sandbox},
	)
	ctr := host + 1
	prevIPs := res.IPs
	if LegacyResult(c.CNIVersion) {
		res.IPs = nil
	}
	for _, addr := range a.Addrs {
		gw := a.GatewayV4
		dst := net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		if addr.Is6() {
			gw = a.GatewayV6
			dst = net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		res.IPs = append(res.IPs, &current.IPConfig{
			Interface: current.Int(ctr),
			Address:   hostNet(addr),
			Gateway:   gw.AsSlice(),
		})
		res.Routes = append(res.Routes, &types.Route{Dst: dst, GW: gw.AsSlice()})
	}
	if LegacyResult(c.CNIVersion) {
		res.IPs = append(res.IPs, prevIPs...)
	}
	if len(res.DNS.Nameservers) == 0 && len(res.DNS.Search) == 0 && len(res.DNS.Options) == 0 && res.DNS.Domain == "" {
		res.DNS = c.DNS
	}
	return res.GetAsVersion(c.CNIVersion)
}

// Encode renders a result in version ver as the runtime reads it.
func Encode(r types.Result, ver string) ([]byte, error) {
	v, err := r.GetAsVersion(ver)
	if err != nil {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("cannot convert result to %s: %v", ver, err), "")
	}
	return json.Marshal(v)
}

// PrevAddrs returns the addresses prevResult assigns to the container
// interface named ifName (in sandbox netns), for CHECK.
func PrevAddrs(c *NetConf, ifName string) ([]netip.Addr, error) {
	if c.PrevResult == nil {
		return nil, nil
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
	}
	var out []netip.Addr
	for _, ip := range prev.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(prev.Interfaces) {
			continue
		}
		if i := prev.Interfaces[*ip.Interface]; i.Name == ifName && i.Sandbox != "" {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

// HasSandboxInterface reports whether r names an interface called name
// inside a sandbox (a pod's side, not the host's).
func HasSandboxInterface(r *current.Result, name string) bool {
	for _, i := range r.Interfaces {
		if i.Name == name && i.Sandbox != "" {
			return true
		}
	}
	return false
}

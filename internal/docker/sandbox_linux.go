package docker

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// sandboxRoutes returns the destinations of the main-table routes in a
// Docker sandbox (to find the gateway routes earlier Joins left there). A
// sandbox skeind cannot open gives none: the first interface's routes are
// then assumed, which is right for every container with one skein network.
func sandboxRoutes(sandbox string) map[netip.Prefix]bool {
	out := map[netip.Prefix]bool{}
	if sandbox == "" {
		return out
	}
	h, closeH, err := netns.Handle(sandbox)
	if err != nil {
		return out
	}
	defer closeH()
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return out
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		if ok {
			out[netip.PrefixFrom(a.Unmap(), ones)] = true
		}
	}
	return out
}

// gatewayRoute is the longest prefix covering gw that is not taken.
func gatewayRoute(gw netip.Addr, taken map[netip.Prefix]bool) netip.Prefix {
	for bits := gw.BitLen(); bits > gw.BitLen()-8; bits-- {
		p, _ := gw.Prefix(bits)
		if !taken[p] {
			return p
		}
	}
	return netip.PrefixFrom(gw, gw.BitLen())
}

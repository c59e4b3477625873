package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
)

// Check verifies that l is plumbed as Setup left it: the host veth exists
// with l.Alias, is up and holds the IPv6 gateway; its peer is l.IfName
// in l.NetNS, up, with every address of l as a /32 or /128 and default
// routes via the gateways; PodTable routes every address to the host veth.
// It returns nil, or an error wrapping ErrMismatch that lists everything
// missing (ErrNetNSNotExist/ErrNotNetNS if the namespace is the problem).
func (d *Dataplane) Check(l Link) (retErr error) {
	defer wrap(&retErr, "check", l.HostName)
	h, put, err := d.acquire()
	if err != nil {
		return err
	}
	defer put()
	var missing []string
	miss := func(format string, args ...any) { missing = append(missing, fmt.Sprintf(format, args...)) }
	done := func() error {
		if len(missing) == 0 {
			return nil
		}
		return fmt.Errorf("%w: %s", ErrMismatch, strings.Join(missing, "; "))
	}
	var v4, v6 bool
	for _, a := range l.Addrs {
		v4, v6 = v4 || a.Is4(), v6 || a.Is6()
	}

	// Host side.
	host, err := h.LinkByName(l.HostName)
	if err != nil {
		if isNotFound(err) {
			miss("host veth %q does not exist", l.HostName)
			return done()
		}
		return fmt.Errorf("find host veth: %w", err)
	}
	ha := host.Attrs()
	if host.Type() != "veth" {
		miss("host link %q is a %s, not a veth", l.HostName, host.Type())
	}
	if ha.Alias != l.Alias {
		miss("host veth alias is %q, want %q", ha.Alias, l.Alias)
	}
	if ha.Flags&net.FlagUp == 0 {
		miss("host veth is down")
	}
	hostAddrs, err := h.AddrList(host, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list host veth addresses: %w", err)
	}
	// The IPv6 gateway is the host veth's own link-local address, or on a
	// link made before that, the shared legacy one (Config.GatewayV6).
	gw6 := LinkLocal(ha.HardwareAddr)
	if v6 && !hasAddr(hostAddrs, gw6, 64) && hasAddr(hostAddrs, d.cfg.GatewayV6, 64) {
		gw6 = d.cfg.GatewayV6
	}
	if v6 && !hasAddr(hostAddrs, gw6, 64) {
		miss("host veth lacks its link-local gateway %s/64", gw6)
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Table: d.cfg.PodTable, LinkIndex: ha.Index},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list table %d: %w", d.cfg.PodTable, err)
	}
	for _, a := range l.Addrs {
		if !hasRoute(routes, netip.PrefixFrom(a, a.BitLen()), netip.Addr{}) {
			miss("no route %s dev %s in table %d", a, l.HostName, d.cfg.PodTable)
		}
	}

	// Pod side.
	pod, closePod, err := netns.Handle(l.NetNS)
	if err != nil {
		return err
	}
	defer closePod()
	ctr, err := pod.LinkByName(l.IfName)
	if err != nil {
		if isNotFound(err) {
			miss("%q does not exist in %s", l.IfName, l.NetNS)
			return done()
		}
		return fmt.Errorf("find %s in pod: %w", l.IfName, err)
	}
	if ctr.Type() != "veth" || ctr.Attrs().ParentIndex != ha.Index {
		miss("%q in %s is not the peer of host veth %q", l.IfName, l.NetNS, l.HostName)
	}
	if ctr.Attrs().Flags&net.FlagUp == 0 {
		miss("%s is down", l.IfName)
	}
	// A plugin chained after skein may make the interface a bridge port
	// and hand its addresses on (skein-vm gives them to a VM behind the
	// bridge): a port carries no L3 configuration of its own, so there is
	// nothing more to check on the pod side.
	if ctr.Attrs().MasterIndex != 0 {
		return done()
	}
	ctrAddrs, err := pod.AddrList(ctr, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list pod addresses: %w", err)
	}
	for _, a := range l.Addrs {
		if !hasAddr(ctrAddrs, a, a.BitLen()) {
			miss("%s lacks %s/%d", l.IfName, a, a.BitLen())
		}
	}
	ctrRoutes, err := pod.RouteList(ctr, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list pod routes: %w", err)
	}
	if v4 && !hasRoute(ctrRoutes, netip.PrefixFrom(netip.IPv4Unspecified(), 0), d.cfg.GatewayV4) {
		miss("no pod default route via %s", d.cfg.GatewayV4)
	}
	if v6 && !hasRoute(ctrRoutes, netip.PrefixFrom(netip.IPv6Unspecified(), 0), gw6) {
		miss("no pod default route via %s", gw6)
	}
	return done()
}

func hasAddr(addrs []netlink.Addr, a netip.Addr, bits int) bool {
	for _, x := range addrs {
		ones, _ := x.Mask.Size()
		if ip, ok := netip.AddrFromSlice(x.IP); ok && ip.Unmap() == a && ones == bits {
			return true
		}
	}
	return false
}

// hasRoute reports whether routes hold dst (a default route when dst has
// length 0) via gw (no gateway when gw is the zero Addr).
func hasRoute(routes []netlink.Route, dst netip.Prefix, gw netip.Addr) bool {
	for _, r := range routes {
		if p, ok := routeDst(r); !ok || p != dst {
			continue
		}
		rgw, _ := netip.AddrFromSlice(r.Gw)
		if rgw.Unmap() == gw {
			return true
		}
	}
	return false
}

// routeDst is r's destination as a prefix of r's family; false if r has no
// usable destination.
func routeDst(r netlink.Route) (netip.Prefix, bool) {
	if r.Dst == nil {
		switch r.Family {
		case netlink.FAMILY_V4:
			return netip.PrefixFrom(netip.IPv4Unspecified(), 0), true
		case netlink.FAMILY_V6:
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0), true
		}
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(r.Dst.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	ones, bits := r.Dst.Mask.Size()
	if bits != ip.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(ip, ones), true
}

package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Pair describes a routed veth whose container end is left in the node
// namespace for a runtime to move: Docker's libnetwork remote driver
// contract. The driver creates the pair, answers Join with the peer's name,
// and Docker itself moves the peer into the container's sandbox, renames it
// (eth0, eth1, …), sets its addresses with the network's mask, and adds the
// routes the driver returned.
type Pair struct {
	HostName string           // host-side veth name, at most 15 bytes
	PeerName string           // the end Docker moves; at most 15 bytes
	Alias    string           // alias of the host veth; must start with Config.AliasPrefix
	Addrs    []netip.Addr     // container addresses, routed to the host veth in PodTable
	MTU      int              // 0 = Config.MTU (or the uplink's)
	PeerMAC  net.HardwareAddr // optional MAC of the peer
	// HostMAC is the optional MAC of the host veth (random if nil). It
	// decides the container's IPv6 gateway, LinkLocal(HostMAC), which a
	// runtime may need to know before SetupPair returns.
	HostMAC net.HardwareAddr
}

// SetupPair plumbs p in the node namespace: a veth pair with both ends
// there, the host end tagged with p.Alias, up, with proxy ARP (without the
// proxy delay: Docker gives containers a /24 and they ARP for neighbours
// directly, so the first packet to each neighbour waits for that reply),
// per-interface forwarding, its link-local address as the IPv6 gateway
// (Applied.GatewayV6) and one PodTable route per address. The peer is left
// down and unaddressed: its runtime moves it.
//
// Like Setup it is all-or-nothing: on any failure the pair is deleted (which
// takes its addresses and routes with it) and an *Error is returned. A taken
// host or peer name gives ErrLinkExists and the existing link is left
// alone; an address already routed in PodTable makes it fail.
//
// Teardown(p.HostName, "", "", nil) removes the pair wherever the peer is
// by then (still in the node, in a container, or gone with its namespace).
func (d *Dataplane) SetupPair(p Pair) (_ Applied, retErr error) {
	defer wrap(&retErr, "setup pair", p.HostName)
	// validateLink checks names, alias, addresses, MTU and MAC; the netns it
	// would check is the node's own here, so any non-empty value will do.
	v4, v6, mtu, err := d.validateLink(Link{
		HostName: p.HostName, Alias: p.Alias, NetNS: "node", IfName: p.PeerName,
		Addrs: p.Addrs, MTU: p.MTU, ContainerMAC: p.PeerMAC,
	})
	if err != nil {
		return Applied{}, err
	}
	if p.HostName == p.PeerName {
		return Applied{}, fmt.Errorf("host and peer are both named %q: %w", p.HostName, ErrInvalid)
	}
	if p.HostMAC != nil && (!unicastMAC(p.HostMAC) || bytes.Equal(p.HostMAC, p.PeerMAC)) {
		return Applied{}, fmt.Errorf("host mac %s is not a unicast ethernet address distinct from the peer's: %w", p.HostMAC, ErrInvalid)
	}
	h, put, err := d.acquire()
	if err != nil {
		return Applied{}, err
	}
	defer put()

	// 1. The pair, in one request, both ends down (see Setup).
	peerMAC := p.PeerMAC
	if peerMAC == nil {
		peerMAC = randomMAC()
	}
	hostMAC := p.HostMAC
	if hostMAC == nil {
		hostMAC = hostMACFor(peerMAC)
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = p.HostName, mtu
	attrs.HardwareAddr = hostMAC
	veth := &netlink.Veth{
		LinkAttrs:        attrs,
		PeerName:         p.PeerName,
		PeerMTU:          uint32(mtu),
		PeerHardwareAddr: peerMAC,
		PeerTxQLen:       -1,
	}
	if err := h.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return Applied{}, d.whichPairExists(h, p)
		}
		return Applied{}, fmt.Errorf("create veth pair %s/%s: %w", p.HostName, p.PeerName, err)
	}
	hostIndex := veth.Index
	defer func() {
		if retErr != nil {
			retErr = d.rollback(h, hostIndex, p.HostName, retErr)
		}
	}()
	if hostIndex == 0 {
		link, err := h.LinkByName(p.HostName)
		if err != nil {
			return Applied{}, fmt.Errorf("find new host veth: %w", err)
		}
		hostIndex = link.Attrs().Index
		veth.Index = hostIndex
	}
	// The tag first: from here on a crash leaves a link reconcile can see.
	if err := h.LinkSetAlias(veth, p.Alias); err != nil {
		return Applied{}, fmt.Errorf("set alias of host veth: %w", err)
	}

	// 2. Host side, as Setup does it; the peer stays down until its
	// runtime moves it.
	if err := d.prepareHostSide(h, veth, v4, v6); err != nil {
		return Applied{}, err
	}
	if err := d.upHostSide(h, veth, p.Addrs); err != nil {
		return Applied{}, err
	}

	peer, err := h.LinkByName(p.PeerName)
	if err != nil {
		return Applied{}, fmt.Errorf("find peer %s: %w", p.PeerName, err)
	}
	ap := Applied{
		HostIndex:      hostIndex,
		HostMAC:        hostMAC,
		ContainerIndex: peer.Attrs().Index,
		ContainerMAC:   peer.Attrs().HardwareAddr,
		MTU:            mtu,
	}
	if v6 {
		ap.GatewayV6 = LinkLocal(hostMAC)
	}
	return ap, nil
}

// prepareHostSide readies the host veth while it is still down: IPv4
// answers ARP for the gateway (proxy ARP, GatewayV4 being a local address
// of the node) and forwards; IPv6 gets the veth's own link-local address,
// the pods' gateway, at once and without DAD; a veth without IPv6
// addresses gets no IPv6 at all.
func (d *Dataplane) prepareHostSide(h *netlink.Handle, veth netlink.Link, v4, v6 bool) error {
	name := veth.Attrs().Name
	var sysctls [][2]string
	if v4 {
		sysctls = append(sysctls,
			[2]string{"net/ipv4/conf/" + name + "/proxy_arp", "1"},
			[2]string{"net/ipv4/conf/" + name + "/forwarding", "1"})
		// Proxy ARP answers broadcast requests after a random delay of
		// up to proxy_delay (0.8 s by default); the gateway is answered by
		// proxy ARP, so the delay must go.
		sysctls = append(sysctls, [2]string{"net/ipv4/neigh/" + name + "/proxy_delay", "0"})
	}
	switch {
	case v6 && d.forceForwarding6:
		sysctls = append(sysctls, [2]string{"net/ipv6/conf/" + name + "/force_forwarding", "1"})
	case !v6 && d.hasIPv6:
		// Every IPv6-enabled link adds routes to the node's IPv6 table
		// (its link-local address, fe80::/64, ff00::/8) that the kernel
		// walks on every later link event; an IPv4-only veth adds none.
		sysctls = append(sysctls, [2]string{"net/ipv6/conf/" + name + "/disable_ipv6", "1"})
	}
	if len(sysctls) > 0 {
		if err := netns.WriteSysctls(d.cfg.NodeNetNS, sysctls...); err != nil {
			return fmt.Errorf("host veth: %w", err)
		}
	}
	if v6 {
		gw := LinkLocal(veth.Attrs().HardwareAddr)
		a := &netlink.Addr{IPNet: &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(veth, a); err != nil {
			return fmt.Errorf("add gateway %s to host veth: %w", gw, err)
		}
	}
	return nil
}

// upHostSide brings the host veth up and routes the pod addresses to it in
// PodTable (an IPv4 route needs its link up).
func (d *Dataplane) upHostSide(h *netlink.Handle, veth netlink.Link, addrs []netip.Addr) error {
	if err := h.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set host veth up: %w", err)
	}
	for _, a := range addrs {
		r := &netlink.Route{LinkIndex: veth.Attrs().Index, Dst: hostNet(a), Table: d.cfg.PodTable, Protocol: netlink.RouteProtocol(d.cfg.PodRouteProto)}
		if a.Is4() {
			r.Scope = netlink.SCOPE_LINK
		}
		if err := h.RouteAdd(r); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("route %s in table %d: already routed to another link: %w", a, d.cfg.PodTable, err)
			}
			return fmt.Errorf("route %s in table %d: %w", a, d.cfg.PodTable, err)
		}
	}
	return nil
}

// whichPairExists explains an EEXIST from LinkAdd without changing anything.
func (d *Dataplane) whichPairExists(h *netlink.Handle, p Pair) error {
	for _, n := range []string{p.HostName, p.PeerName} {
		if _, err := h.LinkByName(n); err == nil {
			return fmt.Errorf("link %q: %w", n, ErrLinkExists)
		}
	}
	return fmt.Errorf("link %q or %q: %w", p.HostName, p.PeerName, ErrLinkExists)
}

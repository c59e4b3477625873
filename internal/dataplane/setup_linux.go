package dataplane

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Link describes one attachment to plumb.
type Link struct {
	HostName     string           // host-side veth name, at most 15 bytes, derived by the caller
	Alias        string           // alias of the host veth; must start with Config.AliasPrefix
	NetNS        string           // pod namespace path
	IfName       string           // container-side name, e.g. "eth0"
	Addrs        []netip.Addr     // pod addresses, installed as /32 and /128
	MTU          int              // 0 = Config.MTU (or the uplink's)
	ContainerMAC net.HardwareAddr // optional MAC of the container side
}

// Applied is what Setup plumbed.
type Applied struct {
	HostIndex      int
	HostMAC        net.HardwareAddr
	ContainerIndex int
	ContainerMAC   net.HardwareAddr
	MTU            int
	// GatewayV6 is the attachment's IPv6 gateway, the host veth's
	// link-local address (LinkLocal(HostMAC)); invalid without IPv6.
	GatewayV6 netip.Addr
}

// Setup plumbs l: a veth pair, the pod side addressed and routed through the
// gateways, the host side answering for the gateways and routed to in
// PodTable. It is all-or-nothing: on any failure it deletes what it created
// and returns an *Error. A taken host or container name gives ErrLinkExists
// and the existing link is not touched. Addresses already routed in PodTable
// (to another pod) make Setup fail rather than steal them.
//
// The recipe keeps netlink round trips few, since ADD latency matters:
// one LinkAdd creates both ends, the peer directly in the pod namespace;
// MACs are chosen here so nothing has to be read back but the container
// index. It also keeps the kernel's own work per ADD independent of how many
// attachments the node has (see "Link events" in the package doc): the host
// end is created down and tagged while down, and brought up only after the
// pod end, so that it becomes ready once, with its carrier.
func (d *Dataplane) Setup(l Link) (_ Applied, retErr error) {
	defer wrap(&retErr, "setup", l.HostName)
	v4, v6, mtu, err := d.validateLink(l)
	if err != nil {
		return Applied{}, err
	}
	h, put, err := d.acquire()
	if err != nil {
		return Applied{}, err
	}
	defer put()

	// 1. The pod namespace: verify it, keep an fd for the veth peer and a
	// netlink socket inside it.
	if err := netns.IsNetNS(l.NetNS); err != nil {
		return Applied{}, err
	}
	nsFile, err := os.Open(l.NetNS)
	if err != nil {
		return Applied{}, fmt.Errorf("open netns: %w", err)
	}
	defer nsFile.Close()
	pod, closePod, err := netns.Handle(l.NetNS)
	if err != nil {
		return Applied{}, err
	}
	defer closePod()

	// 2. The veth pair in one request, both ends down.
	ctrMAC := l.ContainerMAC
	if ctrMAC == nil {
		ctrMAC = randomMAC()
	}
	hostMAC := hostMACFor(ctrMAC)
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = l.HostName, mtu
	attrs.HardwareAddr = hostMAC
	veth := &netlink.Veth{
		LinkAttrs:        attrs,
		PeerName:         l.IfName,
		PeerMTU:          uint32(mtu),
		PeerHardwareAddr: ctrMAC,
		PeerTxQLen:       -1,
		PeerNamespace:    netlink.NsFd(nsFile.Fd()),
	}
	if err := h.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return Applied{}, d.whichExists(h, pod, l)
		}
		return Applied{}, fmt.Errorf("create veth pair %s/%s: %w", l.HostName, l.IfName, err)
	}
	hostIndex := veth.Index // filled by LinkAdd's lookup; 0 if that failed
	defer func() {
		if retErr != nil {
			retErr = d.rollback(h, hostIndex, l.HostName, retErr)
		}
	}()
	if hostIndex == 0 {
		link, err := h.LinkByName(l.HostName)
		if err != nil {
			return Applied{}, fmt.Errorf("find new host veth: %w", err)
		}
		hostIndex = link.Attrs().Index
		veth.Index = hostIndex
	}

	// The kernel ignores IFLA_IFALIAS in a create request, so the ownership
	// tag takes its own round trip.
	if err := h.LinkSetAlias(veth, l.Alias); err != nil {
		return Applied{}, fmt.Errorf("set alias of host veth: %w", err)
	}

	// 3. Host side, still down: sysctls first, so the veth answers ARP and
	// forwards before the pod can send anything, then the IPv6 gateway.
	if err := d.prepareHostSide(h, veth, v4, v6); err != nil {
		return Applied{}, err
	}

	// 4. Both ends up, the pod's first: the host end comes up with its
	// carrier.
	ctr, err := pod.LinkByName(l.IfName)
	if err != nil {
		return Applied{}, fmt.Errorf("find %s in pod: %w", l.IfName, err)
	}
	if err := pod.LinkSetUp(ctr); err != nil {
		return Applied{}, fmt.Errorf("set %s up: %w", l.IfName, err)
	}
	if err := d.upHostSide(h, veth, l.Addrs); err != nil {
		return Applied{}, err
	}

	// 5. Pod side: addresses, default routes via the gateways.
	for _, a := range l.Addrs {
		addr := &netlink.Addr{IPNet: hostNet(a)}
		if a.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrAdd(ctr, addr); err != nil {
			return Applied{}, fmt.Errorf("add %s to %s: %w", a, l.IfName, err)
		}
	}
	var gw6 netip.Addr
	if v4 {
		r := &netlink.Route{LinkIndex: ctr.Attrs().Index, Gw: d.cfg.GatewayV4.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}
		if err := addDefaultRoute(pod, r); err != nil {
			return Applied{}, fmt.Errorf("pod default route via %s: %w", d.cfg.GatewayV4, err)
		}
	}
	if v6 {
		gw6 = LinkLocal(hostMAC)
		r := &netlink.Route{LinkIndex: ctr.Attrs().Index, Gw: gw6.AsSlice()}
		if err := addDefaultRoute(pod, r); err != nil {
			return Applied{}, fmt.Errorf("pod default route via %s: %w", gw6, err)
		}
	}

	return Applied{
		HostIndex:      hostIndex,
		HostMAC:        hostMAC,
		ContainerIndex: ctr.Attrs().Index,
		ContainerMAC:   ctr.Attrs().HardwareAddr,
		MTU:            mtu,
		GatewayV6:      gw6,
	}, nil
}

// rollback deletes the host veth Setup created, which takes the peer, the
// addresses and every route through either end with it, and returns cause.
// If the link cannot be deleted, the error also wraps ErrUndoFailed: the
// pair and its routes may still be there, so the caller must keep the
// addresses held.
//
// index 0 (the new link's index is unknown) finds the link by name.
func (d *Dataplane) rollback(h *netlink.Handle, index int, name string, cause error) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Index, attrs.Name = index, name
	var link netlink.Link = &netlink.Veth{LinkAttrs: attrs}
	var err error
	if index == 0 {
		link, err = h.LinkByName(name)
		if isNotFound(err) {
			return cause
		}
	}
	if err == nil {
		if err = h.LinkDel(link); isNotFound(err) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("%w (undo: delete %s: %w: %v)", cause, name, ErrUndoFailed, err)
	}
	return cause
}

// whichExists explains an EEXIST from LinkAdd without changing anything.
func (d *Dataplane) whichExists(h, pod *netlink.Handle, l Link) error {
	if _, err := h.LinkByName(l.HostName); err == nil {
		return fmt.Errorf("host veth %q: %w", l.HostName, ErrLinkExists)
	}
	if _, err := pod.LinkByName(l.IfName); err == nil {
		return fmt.Errorf("interface %q in %s: %w", l.IfName, l.NetNS, ErrLinkExists)
	}
	return fmt.Errorf("host veth %q or interface %q: %w", l.HostName, l.IfName, ErrLinkExists)
}

// validateLink checks l before anything is touched and reports which
// families it uses and the MTU to apply.
func (d *Dataplane) validateLink(l Link) (v4, v6 bool, mtu int, err error) {
	if err := validIfName("host name", l.HostName); err != nil {
		return false, false, 0, err
	}
	if err := validIfName("interface name", l.IfName); err != nil {
		return false, false, 0, err
	}
	if !strings.HasPrefix(l.Alias, d.cfg.AliasPrefix) || len(l.Alias) > MaxAliasLen {
		return false, false, 0, fmt.Errorf("alias %q must start with %q and fit %d bytes: %w", l.Alias, d.cfg.AliasPrefix, MaxAliasLen, ErrInvalid)
	}
	if l.NetNS == "" {
		return false, false, 0, fmt.Errorf("no pod netns: %w", ErrInvalid)
	}
	if len(l.Addrs) == 0 {
		return false, false, 0, fmt.Errorf("no addresses: %w", ErrInvalid)
	}
	seen := map[netip.Addr]bool{}
	for _, a := range l.Addrs {
		switch {
		case !a.IsValid(), a.Zone() != "", a.Is4In6(), a.IsUnspecified(), a.IsLoopback(),
			a.IsMulticast(), a.IsLinkLocalUnicast(), a.IsInterfaceLocalMulticast():
			return false, false, 0, fmt.Errorf("address %q cannot be a pod address: %w", a, ErrInvalid)
		case seen[a]:
			return false, false, 0, fmt.Errorf("address %s given twice: %w", a, ErrInvalid)
		case a == d.cfg.GatewayV4 || a == d.cfg.GatewayV6:
			return false, false, 0, fmt.Errorf("address %s is the gateway: %w", a, ErrInvalid)
		}
		seen[a] = true
		v4, v6 = v4 || a.Is4(), v6 || a.Is6()
	}
	mtu = l.MTU
	if mtu == 0 {
		mtu = d.mtu
	}
	switch {
	case mtu < 68 || mtu > 65535:
		return false, false, 0, fmt.Errorf("mtu %d out of range: %w", mtu, ErrInvalid)
	case v6 && mtu < 1280:
		return false, false, 0, fmt.Errorf("mtu %d is below IPv6's minimum 1280: %w", mtu, ErrInvalid)
	}
	if l.ContainerMAC != nil && !unicastMAC(l.ContainerMAC) {
		return false, false, 0, fmt.Errorf("container mac %s is not a unicast ethernet address: %w", l.ContainerMAC, ErrInvalid)
	}
	return v4, v6, mtu, nil
}

// validIfName applies the kernel's rules (dev_valid_name).
func validIfName(what, name string) error {
	if name == "" || len(name) > unix.IFNAMSIZ-1 || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n\r\v\f") {
		return fmt.Errorf("%s %q is not a valid interface name: %w", what, name, ErrInvalid)
	}
	return nil
}

// unicastMAC reports whether mac is a unicast Ethernet address.
func unicastMAC(mac net.HardwareAddr) bool {
	return len(mac) == 6 && mac[0]&1 == 0 && !isZero(mac)
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// randomMAC returns a random locally administered unicast address, as the
// kernel would pick; choosing it here saves reading it back.
func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	_, _ = rand.Read(mac)
	mac[0] = mac[0]&^1 | 2
	return mac
}

// hostMACFor returns a random MAC for a host veth whose peer has peerMAC:
// never the same, so the two ends' link-local addresses differ (the host
// end's is the pod's IPv6 gateway, installed without DAD).
func hostMACFor(peerMAC net.HardwareAddr) net.HardwareAddr {
	for {
		if m := randomMAC(); !bytes.Equal(m, peerMAC) {
			return m
		}
	}
}

// LinkLocal returns the modified EUI-64 link-local address of mac (RFC
// 4291, appendix A): the address the kernel itself gives an interface with
// that MAC, and the IPv6 gateway of an attachment whose host veth has it.
// It is the zero Addr unless mac is 6 bytes long.
func LinkLocal(mac net.HardwareAddr) netip.Addr {
	if len(mac) != 6 {
		return netip.Addr{}
	}
	var a [16]byte
	a[0], a[1] = 0xfe, 0x80
	a[8], a[9], a[10] = mac[0]^0x02, mac[1], mac[2]
	a[11], a[12] = 0xff, 0xfe
	a[13], a[14], a[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(a)
}

// hostNet is a as a /32 or /128.
func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

// addDefaultRoute adds a pod's default route. A pod that already has one
// (a second interface: Multus, or a second skein network) keeps it as its
// primary; this interface's default route gets a metric of its own, above
// the kernel's defaults, so both exist and the first one wins.
func addDefaultRoute(pod *netlink.Handle, r *netlink.Route) error {
	err := pod.RouteAdd(r)
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	r.Priority = secondaryMetricBase + r.LinkIndex
	return pod.RouteAdd(r)
}

// secondaryMetricBase is the metric of default routes of secondary
// interfaces, plus their index (distinct per interface).
const secondaryMetricBase = 2048

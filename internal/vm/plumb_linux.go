package vm

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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

// AliasPrefix starts the alias of every bridge and tap skein-vm makes, so
// a restarted skeind (and an operator) can tell them apart.
const AliasPrefix = "skein-vm:"

// Sentinel errors of the plumbing; callers branch with errors.Is.
var (
	// ErrNoInterface: the main plugin's interface is not in the pod.
	ErrNoInterface = errors.New("interface not found in the pod")
	// ErrAlreadyPlumbed: the interface is already a bridge port.
	ErrAlreadyPlumbed = errors.New("interface is already a bridge port")
	// ErrNotEthernet: the interface cannot be a bridge port.
	ErrNotEthernet = errors.New("interface is not an Ethernet-like link")
	// ErrTapBusy: another process holds the tap (a VM is running).
	ErrTapBusy = errors.New("tap is in use by another process")
)

// Port is one VM interface in a pod: the main plugin's veth turned into a
// bridge port, the bridge, the tap, and what the veth carried before, so
// DEL can give it back. It is stored with the attachment.
type Port struct {
	Lease  Lease  `json:"lease"`
	Veth   string `json:"veth"`
	Bridge string `json:"bridge"`
	Tap    string `json:"tap"`
	// BridgeMAC is the bridge's address (the DHCP replies' source; the
	// DHCPv6 DUID); VethMAC the veth's new one.
	BridgeMAC string `json:"bridgeMAC"`
	VethMAC   string `json:"vethMAC"`
	// Addrs and Routes are what the main plugin put on the veth.
	Addrs  []SavedAddr  `json:"addrs,omitempty"`
	Routes []SavedRoute `json:"routes,omitempty"`
	// Disable6 is the veth's net.ipv6.conf.*.disable_ipv6 before ADD
	// ("" when the namespace has no IPv6).
	Disable6 string `json:"disable6,omitempty"`
}

// SavedAddr is an address taken off the veth.
type SavedAddr struct {
	Prefix    netip.Prefix `json:"prefix"`
	Flags     int          `json:"flags,omitempty"`
	Scope     int          `json:"scope,omitempty"`
	Broadcast netip.Addr   `json:"broadcast,omitzero"`
	Label     string       `json:"label,omitempty"`
}

// SavedRoute is a route through the veth (any table but local), taken
// away with its addresses.
type SavedRoute struct {
	Dst      netip.Prefix `json:"dst"`
	Gw       netip.Addr   `json:"gw,omitzero"`
	Src      netip.Addr   `json:"src,omitzero"`
	Table    int          `json:"table"`
	Type     int          `json:"type"`
	Scope    int          `json:"scope"`
	Protocol int          `json:"protocol"`
	Priority int          `json:"priority,omitempty"`
	Flags    int          `json:"flags,omitempty"`
}

// names derives the bridge and tap names from the network and the veth:
// stable (DEL finds them without the record) and within IFNAMSIZ.
func names(network, veth string) (bridge, tap string) {
	h := sha256.Sum256([]byte(network + "\x00" + veth))
	s := hex.EncodeToString(h[:4])
	return "skbr" + s, "sktap" + s
}

// Inspect reads the main plugin's interface l.IfName in the pod and fills
// in a Port for it: the lease's MAC (the one the result promised; the
// link's own if the result gave none) and MTU, and everything the veth
// carries. It changes nothing.
func Inspect(nsPath, network string, l Lease) (Port, error) {
	pod, closePod, err := netns.Handle(nsPath)
	if err != nil {
		return Port{}, err
	}
	defer closePod()
	link, err := pod.LinkByName(l.IfName)
	if err != nil {
		if isNotFound(err) {
			return Port{}, fmt.Errorf("%w: %q (the main plugin's result names it)", ErrNoInterface, l.IfName)
		}
		return Port{}, fmt.Errorf("find %s: %w", l.IfName, err)
	}
	a := link.Attrs()
	if a.MasterIndex != 0 {
		return Port{}, fmt.Errorf("%w: %s", ErrAlreadyPlumbed, l.IfName)
	}
	if len(a.HardwareAddr) != 6 || a.EncapType != "ether" {
		return Port{}, fmt.Errorf("%w: %s (%s)", ErrNotEthernet, l.IfName, link.Type())
	}
	if l.MAC == "" {
		l.MAC = a.HardwareAddr.String()
	} else if l.MAC != a.HardwareAddr.String() {
		return Port{}, fmt.Errorf("%w: %s has MAC %s, the main plugin's result promised %s", ErrNoInterface, l.IfName, a.HardwareAddr, l.MAC)
	}
	l.MTU = a.MTU
	p := Port{Lease: l, Veth: l.IfName}
	p.Bridge, p.Tap = names(network, l.IfName)

	addrs, err := pod.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return Port{}, fmt.Errorf("list addresses of %s: %w", l.IfName, err)
	}
	for _, ad := range addrs {
		ip, ok := netip.AddrFromSlice(ad.IP)
		if !ok || ip.Unmap().Is6() && ip.IsLinkLocalUnicast() {
			continue // the IPv6 link-local address comes back with the link
		}
		ones, _ := ad.Mask.Size()
		pf := netip.PrefixFrom(ip.Unmap(), ones)
		sa := SavedAddr{Prefix: pf, Flags: ad.Flags, Scope: ad.Scope}
		if b, ok := netip.AddrFromSlice(ad.Broadcast); ok && !b.Unmap().IsUnspecified() {
			sa.Broadcast = b.Unmap()
		}
		if ad.Label != l.IfName {
			sa.Label = ad.Label
		}
		p.Addrs = append(p.Addrs, sa)
	}
	routes, err := pod.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: a.Index, Table: unix.RT_TABLE_UNSPEC},
		netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		return Port{}, fmt.Errorf("list routes of %s: %w", l.IfName, err)
	}
	for _, r := range routes {
		if r.Table == unix.RT_TABLE_LOCAL || r.Protocol == unix.RTPROT_KERNEL || len(r.MultiPath) > 0 {
			continue // recreated by the kernel with the addresses
		}
		p.Routes = append(p.Routes, saveRoute(r))
	}
	err = netns.Do(nsPath, func() error {
		b, err := os.ReadFile(sysctlDisable6(l.IfName))
		if err == nil {
			p.Disable6 = strings.TrimSpace(string(b))
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
	if err != nil {
		return Port{}, fmt.Errorf("read disable_ipv6 of %s: %w", l.IfName, err)
	}
	return p, nil
}

func sysctlDisable6(ifName string) string {
	return "/proc/sys/net/ipv6/conf/" + ifName + "/disable_ipv6"
}

func saveRoute(r netlink.Route) SavedRoute {
	s := SavedRoute{Table: r.Table, Type: r.Type, Scope: int(r.Scope), Protocol: int(r.Protocol), Priority: r.Priority, Flags: r.Flags}
	if r.Dst != nil {
		s.Dst, _ = prefixOf(*r.Dst)
	} else if r.Family == unix.AF_INET6 {
		s.Dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	} else {
		s.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	if a, ok := netip.AddrFromSlice(r.Gw); ok {
		s.Gw = a.Unmap()
	}
	if a, ok := netip.AddrFromSlice(r.Src); ok {
		s.Src = a.Unmap()
	}
	return s
}

func (s SavedRoute) route(index int) *netlink.Route {
	r := &netlink.Route{
		LinkIndex: index, Table: s.Table, Type: s.Type, Scope: netlink.Scope(s.Scope),
		Protocol: netlink.RouteProtocol(s.Protocol), Priority: s.Priority, Flags: s.Flags,
		Dst: &net.IPNet{IP: s.Dst.Addr().AsSlice(), Mask: net.CIDRMask(s.Dst.Bits(), s.Dst.Addr().BitLen())},
	}
	if s.Dst.Bits() == 0 {
		r.Dst = nil
		r.Family = unix.AF_INET
		if s.Dst.Addr().Is6() {
			r.Family = unix.AF_INET6
		}
	}
	if s.Gw.IsValid() {
		r.Gw = s.Gw.AsSlice()
	}
	if s.Src.IsValid() {
		r.Src = s.Src.AsSlice()
	}
	return r
}

// Plumb turns the veth of p into a VM port inside the pod: the veth loses
// its routes, addresses and MAC (the VM takes that MAC), a bridge and a
// persistent tap are made and tagged with alias, the veth and the tap
// become bridge ports with the veth's MTU, everything is brought up, and
// the nftables rules that keep DHCP inside the pod are installed. On
// failure everything is undone (Unplumb) before the error is returned.
func Plumb(nsPath string, p *Port, alias string) (retErr error) {
	pod, closePod, err := netns.Handle(nsPath)
	if err != nil {
		return err
	}
	defer closePod()
	veth, err := pod.LinkByName(p.Veth)
	if err != nil {
		return fmt.Errorf("find %s: %w", p.Veth, err)
	}
	defer func() {
		if retErr != nil {
			if err := Unplumb(nsPath, *p); err != nil {
				retErr = fmt.Errorf("%w (and undoing it: %v)", retErr, err)
			}
		}
	}()
	mtu := p.Lease.MTU

	// 1. The bridge, with a fixed MAC (a bridge otherwise takes its lowest
	// port's, which would change as ports come and go) and no multicast
	// snooping (DHCPv6 and RS are multicast; the server must see them).
	brMAC, vethMAC := randomMAC(), randomMAC()
	p.BridgeMAC, p.VethMAC = brMAC.String(), vethMAC.String()
	off := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: p.Bridge, MTU: mtu, HardwareAddr: brMAC, TxQLen: -1}, MulticastSnooping: &off}
	if err := pod.LinkAdd(br); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: bridge %s exists", ErrAlreadyPlumbed, p.Bridge)
		}
		return fmt.Errorf("create bridge %s: %w", p.Bridge, err)
	}
	if err := pod.LinkSetAlias(br, alias); err != nil {
		return fmt.Errorf("tag bridge %s: %w", p.Bridge, err)
	}

	// 2. The tap: persistent, so it outlives skeind's file descriptor and
	// waits for the VM's.
	if err := createTap(nsPath, p.Tap); err != nil {
		return err
	}
	tap, err := pod.LinkByName(p.Tap)
	if err != nil {
		return fmt.Errorf("find tap %s: %w", p.Tap, err)
	}
	if err := pod.LinkSetAlias(tap, alias); err != nil {
		return fmt.Errorf("tag tap %s: %w", p.Tap, err)
	}
	if err := pod.LinkSetMTU(tap, mtu); err != nil {
		return fmt.Errorf("set MTU of tap %s: %w", p.Tap, err)
	}

	// 3. The veth gives up what made it the pod's interface: routes,
	// addresses (IPv6 off, so no link-local address lingers either) and
	// its MAC, which the VM's NIC takes over.
	for _, r := range p.Routes {
		if err := pod.RouteDel(r.route(veth.Attrs().Index)); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("remove route %s from %s: %w", r.Dst, p.Veth, err)
		}
	}
	for _, a := range p.Addrs {
		if err := pod.AddrDel(veth, &netlink.Addr{IPNet: prefixNet(a.Prefix)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove %s from %s: %w", a.Prefix, p.Veth, err)
		}
	}
	if p.Disable6 != "" {
		if err := netns.WriteSysctl(nsPath, "net/ipv6/conf/"+p.Veth+"/disable_ipv6", "1"); err != nil {
			return err
		}
	}
	for _, name := range []string{p.Bridge, p.Tap} {
		// The bridge and the tap carry no IP either; without this the
		// kernel would give them link-local addresses and send from them.
		_ = netns.WriteSysctl(nsPath, "net/ipv6/conf/"+name+"/disable_ipv6", "1")
	}
	if err := setMAC(pod, veth, vethMAC); err != nil {
		return fmt.Errorf("give %s a new MAC: %w", p.Veth, err)
	}

	// 4. Ports, then up.
	for _, l := range []netlink.Link{veth, tap} {
		if err := pod.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("enslave %s to %s: %w", l.Attrs().Name, p.Bridge, err)
		}
	}
	// The guest is not trusted: the tap port learns nothing (a guest
	// sending from ever new source MACs would otherwise grow the bridge's
	// table without bound; frames to the VM reach it as unknown unicast,
	// the bridge having two ports), and the filter below drops frames
	// from the tap with any source MAC but the VM's.
	vmMAC := p.Lease.HWAddr()
	if vmMAC == nil {
		return fmt.Errorf("the lease has no MAC for %s", p.Tap)
	}
	if err := pod.LinkSetLearning(tap, false); err != nil {
		return fmt.Errorf("turn learning off on %s: %w", p.Tap, err)
	}
	for _, l := range []netlink.Link{br, tap, veth} {
		if err := pod.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", l.Attrs().Name, err)
		}
	}

	// 5. DHCP stays inside the pod; the guest sends as itself.
	return installFilter(nsPath, p.Bridge, p.Veth, p.Tap, vmMAC)
}

// Unplumb undoes Plumb as far as it got: it removes the filter, the tap
// and the bridge, and gives the veth back its MAC, IPv6 setting,
// addresses and routes. It is idempotent and succeeds when the namespace
// is gone.
func Unplumb(nsPath string, p Port) error {
	if err := netns.IsNetNS(nsPath); err != nil {
		if errors.Is(err, netns.ErrNotExist) || errors.Is(err, netns.ErrNotNetNS) {
			return nil // gone (a path that is no namespace any more, too)
		}
		return err
	}
	pod, closePod, err := netns.Handle(nsPath)
	if err != nil {
		return err
	}
	defer closePod()
	var errs []error
	if err := removeFilter(nsPath, p.Bridge); err != nil {
		errs = append(errs, err)
	}
	for _, name := range []string{p.Tap, p.Bridge} {
		l, err := pod.LinkByName(name)
		if err != nil {
			if !isNotFound(err) {
				errs = append(errs, fmt.Errorf("find %s: %w", name, err))
			}
			continue
		}
		if a := l.Attrs().Alias; a != "" && !strings.HasPrefix(a, AliasPrefix) {
			errs = append(errs, fmt.Errorf("%s is not skein-vm's (alias %q): left alone", name, a))
			continue
		}
		if err := pod.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
		}
	}
	if err := restoreVeth(nsPath, pod, p); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func restoreVeth(nsPath string, pod *netlink.Handle, p Port) error {
	veth, err := pod.LinkByName(p.Veth)
	if err != nil {
		if isNotFound(err) {
			return nil // the main plugin's DEL came first: nothing to give back
		}
		return fmt.Errorf("find %s: %w", p.Veth, err)
	}
	if veth.Attrs().MasterIndex != 0 {
		if err := pod.LinkSetNoMaster(veth); err != nil {
			return fmt.Errorf("release %s: %w", p.Veth, err)
		}
	}
	if mac := p.Lease.HWAddr(); mac != nil && veth.Attrs().HardwareAddr.String() != mac.String() {
		if err := setMAC(pod, veth, mac); err != nil {
			return fmt.Errorf("give %s back MAC %s: %w", p.Veth, mac, err)
		}
	}
	if p.Disable6 != "" {
		if err := netns.WriteSysctl(nsPath, "net/ipv6/conf/"+p.Veth+"/disable_ipv6", p.Disable6); err != nil {
			return err
		}
	}
	if err := pod.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set %s up: %w", p.Veth, err)
	}
	for _, a := range p.Addrs {
		ad := &netlink.Addr{IPNet: prefixNet(a.Prefix), Scope: a.Scope, Label: a.Label,
			Flags: a.Flags & (unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE | unix.IFA_F_HOMEADDRESS | unix.IFA_F_MANAGETEMPADDR)}
		if a.Broadcast.IsValid() {
			ad.Broadcast = a.Broadcast.AsSlice()
		}
		if err := pod.AddrAdd(veth, ad); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("give %s back %s: %w", p.Veth, a.Prefix, err)
		}
	}
	// Routes without a gateway first: later ones may go through them.
	for _, pass := range []bool{false, true} {
		for _, r := range p.Routes {
			if r.Gw.IsValid() != pass {
				continue
			}
			if err := pod.RouteAdd(r.route(veth.Attrs().Index)); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("give %s back route %s: %w", p.Veth, r.Dst, err)
			}
		}
	}
	return nil
}

// setMAC changes a link's MAC, taking it down first if the driver refuses
// to change it while up.
func setMAC(h *netlink.Handle, l netlink.Link, mac net.HardwareAddr) error {
	err := h.LinkSetHardwareAddr(l, mac)
	if !errors.Is(err, unix.EBUSY) {
		return err
	}
	if err := h.LinkSetDown(l); err != nil {
		return err
	}
	if err := h.LinkSetHardwareAddr(l, mac); err != nil {
		return err
	}
	return h.LinkSetUp(l)
}

// createTap makes a persistent tap (no packet information header, no
// virtio-net header) in the pod namespace. /dev/net/tun attaches the
// device to the namespace of the thread that opens it, so this happens
// inside netns.Do.
func createTap(nsPath, name string) error {
	return netns.Do(nsPath, func() error {
		f, err := attachTap(name)
		if err != nil {
			return fmt.Errorf("create tap %s: %w", name, err)
		}
		defer f.Close()
		if err := unix.IoctlSetInt(int(f.Fd()), unix.TUNSETPERSIST, 1); err != nil {
			return fmt.Errorf("make tap %s persistent: %w", name, err)
		}
		return nil
	})
}

// attachTap opens /dev/net/tun and attaches it to the tap called name,
// creating it if it does not exist, in the calling thread's namespace.
func attachTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("%w: %s", ErrTapBusy, name)
		}
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// OpenTap returns a file descriptor attached to the existing tap name in
// the pod namespace, for a VM. ErrTapBusy if a VM holds it already.
func OpenTap(nsPath, name string) (*os.File, error) {
	var f *os.File
	err := netns.Do(nsPath, func() error {
		if _, err := net.InterfaceByName(name); err != nil {
			return fmt.Errorf("tap %s: %w", name, ErrNoInterface)
		}
		var err error
		f, err = attachTap(name)
		return err
	})
	return f, err
}

// CheckPlumb verifies that p is plumbed as Plumb left it.
func CheckPlumb(nsPath string, p Port, alias string) error {
	pod, closePod, err := netns.Handle(nsPath)
	if err != nil {
		return err
	}
	defer closePod()
	var missing []string
	miss := func(format string, args ...any) { missing = append(missing, fmt.Sprintf(format, args...)) }
	br, err := pod.LinkByName(p.Bridge)
	switch {
	case err != nil:
		miss("bridge %s: %v", p.Bridge, err)
	case br.Type() != "bridge" || br.Attrs().Alias != alias:
		miss("%s is not skein-vm's bridge (type %s, alias %q)", p.Bridge, br.Type(), br.Attrs().Alias)
	case br.Attrs().Flags&net.FlagUp == 0:
		miss("bridge %s is down", p.Bridge)
	}
	for _, name := range []string{p.Tap, p.Veth} {
		l, err := pod.LinkByName(name)
		if err != nil {
			miss("%s: %v", name, err)
			continue
		}
		if br == nil || l.Attrs().MasterIndex != br.Attrs().Index {
			miss("%s is not a port of %s", name, p.Bridge)
		}
		if name == p.Tap && (l.Type() != "tuntap" || l.Attrs().Alias != alias) {
			miss("%s is not skein-vm's tap (type %s, alias %q)", name, l.Type(), l.Attrs().Alias)
		}
		if name == p.Veth {
			addrs, err := pod.AddrList(l, netlink.FAMILY_ALL)
			if err == nil && len(addrs) > 0 {
				miss("%s still has addresses (%v)", name, addrs[0].IPNet)
			}
		}
	}
	if err := checkFilter(nsPath, p.Bridge); err != nil {
		miss("%v", err)
	}
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "; "))
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func randomMAC() net.HardwareAddr {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	b[0] = b[0]&^0x01 | 0x02 // unicast, locally administered
	return b
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// Package bench holds skein's benchmark: the harness behind `make bench`
// (cmd/skein-bench) that measures skein side by side with the reference
// CNI plugins and the raw-netlink floor of the same plumbing, on one
// machine in one run, and the `go test -bench` micro-benchmarks.
package bench

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/netns"
)

// Floor does the kernel work of a skein attachment and nothing else — no
// IPAM, no store, no IPC, no process — with the dataplane's recipe and in
// as few netlink requests as it makes: the veth pair in one request with
// the peer created in the pod, both ends down; the tag alias and the host
// side's sysctls and IPv6 gateway (its own link-local address) while the
// host end is down; the pod end up, then the host end; the host routes to
// the pod; in the pod, addresses and default routes via the gateways. The
// IPv4 gateway is one local route of the node, made by NewFloor. It is the
// limit any plugin of this design can approach.
//
// Concurrent calls use netlink sockets of their own: vishvananda/netlink
// holds a handle's socket for the whole of a request, so one shared
// handle would queue every ADD behind a DEL's ~15 ms veth teardown and
// measure that queue instead of the kernel.
type Floor struct {
	nodePath string
	idle     chan *netlink.Handle
	mu       sync.Mutex
	closers  []func()
}

// NewFloor returns a floor plumber for the node namespace at nodePath and
// a function that closes its sockets. It makes the IPv4 gateway a local
// address of the node, as dataplane.Init does.
func NewFloor(nodePath string) (*Floor, func(), error) {
	f := &Floor{nodePath: nodePath, idle: make(chan *netlink.Handle, 256)}
	h, err := f.get() // fail now if the namespace is unusable
	if err != nil {
		return nil, nil, err
	}
	gw := &netlink.Route{LinkIndex: 1, Dst: netlink.NewIPNet(gw4.AsSlice()), Type: unix.RTN_LOCAL,
		Scope: netlink.SCOPE_HOST, Table: unix.RT_TABLE_LOCAL}
	if err := h.RouteReplace(gw); err != nil {
		return nil, nil, fmt.Errorf("local route for %s: %w", gw4, err)
	}
	f.put(h)
	return f, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.closers {
			c()
		}
		f.closers = nil
	}, nil
}

// get returns an idle node handle or opens one.
func (f *Floor) get() (*netlink.Handle, error) {
	select {
	case h := <-f.idle:
		return h, nil
	default:
	}
	h, closeH, err := netns.Handle(f.nodePath)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.closers = append(f.closers, closeH)
	f.mu.Unlock()
	return h, nil
}

func (f *Floor) put(h *netlink.Handle) {
	select {
	case f.idle <- h:
	default: // more callers than slots: closed with the others at the end
	}
}

var gw4 = netip.MustParseAddr("169.254.1.1")

// Setup plumbs host link hostName to ifName in the pod at podPath. It is
// safe for concurrent use.
func (f *Floor) Setup(hostName, podPath, ifName string, addrs []netip.Addr) error {
	node, err := f.get()
	if err != nil {
		return err
	}
	defer f.put(node)
	pod, closePod, err := netns.Handle(podPath)
	if err != nil {
		return err
	}
	defer closePod()
	nsf, err := os.Open(podPath)
	if err != nil {
		return err
	}
	defer nsf.Close()

	hostMAC := net.HardwareAddr{0x02, 0xf1, 0, 0, 0, 0}
	_, _ = rand.Read(hostMAC[2:])
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName, HardwareAddr: hostMAC, TxQLen: -1},
		PeerName: ifName, PeerTxQLen: -1, PeerNamespace: netlink.NsFd(nsf.Fd())}
	if err := node.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	if err := node.LinkSetAlias(veth, "floor:"+hostName); err != nil {
		return err
	}
	var has4, has6 bool
	for _, a := range addrs {
		has4, has6 = has4 || a.Is4(), has6 || a.Is6()
	}
	var sysctls [][2]string
	if has4 {
		sysctls = append(sysctls,
			[2]string{"net/ipv4/conf/" + hostName + "/proxy_arp", "1"},
			[2]string{"net/ipv4/conf/" + hostName + "/forwarding", "1"},
			[2]string{"net/ipv4/neigh/" + hostName + "/proxy_delay", "0"})
	}
	if !has6 {
		sysctls = append(sysctls, [2]string{"net/ipv6/conf/" + hostName + "/disable_ipv6", "1"})
	}
	if err := netns.WriteSysctls(f.nodePath, sysctls...); err != nil {
		return err
	}
	gw6 := dataplane.LinkLocal(hostMAC)
	if has6 {
		gw := &netlink.Addr{IPNet: &net.IPNet{IP: gw6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := node.AddrAdd(veth, gw); err != nil {
			return err
		}
	}
	ctr, err := pod.LinkByName(ifName)
	if err != nil {
		return err
	}
	if err := pod.LinkSetUp(ctr); err != nil {
		return err
	}
	if err := node.LinkSetUp(veth); err != nil {
		return err
	}
	for _, a := range addrs {
		host := &netlink.Route{LinkIndex: veth.Index, Dst: netlink.NewIPNet(a.AsSlice()), Table: 116}
		if a.Is4() {
			host.Scope = netlink.SCOPE_LINK
		}
		if err := node.RouteAdd(host); err != nil {
			return fmt.Errorf("host route %s: %w", a, err)
		}
	}
	for _, a := range addrs {
		ad := &netlink.Addr{IPNet: netlink.NewIPNet(a.AsSlice())}
		if a.Is6() {
			ad.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrAdd(ctr, ad); err != nil {
			return err
		}
	}
	if has4 {
		if err := pod.RouteAdd(&netlink.Route{LinkIndex: ctr.Attrs().Index, Gw: gw4.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}); err != nil {
			return fmt.Errorf("pod default route: %w", err)
		}
	}
	if has6 {
		if err := pod.RouteAdd(&netlink.Route{LinkIndex: ctr.Attrs().Index, Gw: gw6.AsSlice()}); err != nil {
			return fmt.Errorf("pod default route: %w", err)
		}
	}
	return nil
}

// Teardown deletes the host link, and with it the peer, the addresses and
// the routes, and returns when the kernel answers: after it has freed the
// pair, as a plain netlink delete does. skein's DEL returns earlier, once
// the kernel has unlisted the pair (see internal/dataplane), so the floor's
// DEL is not a floor for skein's.
func (f *Floor) Teardown(hostName string) error {
	node, err := f.get()
	if err != nil {
		return err
	}
	defer f.put(node)
	l, err := node.LinkByName(hostName)
	if err != nil {
		return err
	}
	return node.LinkDel(l)
}

// TeardownInPod deletes the pair from the pod's end, inside the pod's
// namespace, as the reference bridge and ptp plugins do.
func (f *Floor) TeardownInPod(podPath, ifName string) error {
	pod, closePod, err := netns.Handle(podPath)
	if err != nil {
		return err
	}
	defer closePod()
	l, err := pod.LinkByName(ifName)
	if err != nil {
		return err
	}
	return pod.LinkDel(l)
}

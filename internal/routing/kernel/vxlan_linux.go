package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The vxlan mode, per node:
//
//	skein.vxlan: vxlan id VNI dstport Port local L dev <link of L> nolearning,
//	             address MACFor(L), alias skein:routing:vxlan
//
// where L = UnderlayAddr(local addresses) (IPv4 if the node has one, else
// IPv6), and per remote node with underlay address P (its address of L's
// family), and per block B of it:
//
//	bridge fdb MACFor(P) dst P dev skein.vxlan self permanent
//	ip neigh B.Addr() lladdr MACFor(P) dev skein.vxlan nud permanent
//	ip route B via B.Addr() dev skein.vxlan onlink table Table proto Protocol
//
// A packet to a pod in B is routed to the device with the gateway B.Addr(),
// whose permanent neighbour entry gives the peer device's MAC, whose FDB
// entry gives the peer's underlay address. The peer's device has that MAC, so
// it takes the inner frame up to IP, and its own pod routes deliver it.
// B.Addr() need not be an address of anything: it is only a key that maps
// the block to its node (one neighbour per block, so a block moving to
// another node changes one entry).

// underlay finds the link holding the local address and its MTU.
func (k *Kernel) underlay(local netip.Addr) (index, mtu int, err error) {
	addrs, err := k.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return 0, 0, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if addrOf(a.IP) != local {
			continue
		}
		l, err := k.h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return 0, 0, fmt.Errorf("link of local address %s: %w", local, err)
		}
		if l.Attrs().Flags&net.FlagLoopback != 0 {
			// An address on lo: no link to bind to; the kernel picks the
			// route to each peer. Assume an Ethernet underlay.
			return 0, 1500, nil
		}
		return a.LinkIndex, l.Attrs().MTU, nil
	}
	return 0, 0, fmt.Errorf("local address %s is on no link of the node", local)
}

// PodMTU is the MTU pods need for their traffic to other nodes: in vxlan
// mode the device's (VXLAN.MTU, or the underlay link's MTU minus the
// overhead), 0 (no limit of ours) in the other modes. It changes nothing.
func (k *Kernel) PodMTU() (int, error) {
	if k.cfg.Mode != routing.ModeVXLAN {
		return 0, nil
	}
	if k.cfg.VXLAN.MTU != 0 {
		return k.cfg.VXLAN.MTU, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closeH == nil {
		return 0, errors.New("routing pod mtu: kernel closed")
	}
	local := routing.UnderlayAddr(k.local)
	_, mtu, err := k.underlay(local)
	if err != nil {
		return 0, fmt.Errorf("routing pod mtu: %w", err)
	}
	return PodMTU(mtu, local), nil
}

// ourDevice returns the VXLAN device if a link of its name exists and
// carries skein's alias; nil if there is none; an error if the name is
// taken by a link that is not skein's.
func (k *Kernel) ourDevice() (netlink.Link, error) {
	l, err := k.h.LinkByName(k.cfg.VXLAN.Device)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", k.cfg.VXLAN.Device, err)
	}
	if !k.owned(l) {
		return nil, fmt.Errorf("link %s exists and is not skein's (alias %q); not touching it", k.cfg.VXLAN.Device, l.Attrs().Alias)
	}
	return l, nil
}

// owned: l is skein's VXLAN device. The kernel takes no alias when it
// creates a link, so ensureDevice sets it right after; a vxlan link without
// alias whose MAC is the one MACFor gives a local address is one that a
// crash left between the two steps.
func (k *Kernel) owned(l netlink.Link) bool {
	if l.Attrs().Alias == deviceAlias {
		return true
	}
	if _, ok := l.(*netlink.Vxlan); !ok || l.Attrs().Alias != "" {
		return false
	}
	for _, a := range k.local {
		if bytes.Equal(l.Attrs().HardwareAddr, MACFor(a)) {
			return true
		}
	}
	return false
}

// deleteDevice deletes the VXLAN device if it is skein's, and with it its
// FDB and neighbour entries and the routes through it. A link of that name
// that is not skein's is left alone.
func (k *Kernel) deleteDevice() error {
	l, err := k.h.LinkByName(k.cfg.VXLAN.Device)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up %s: %w", k.cfg.VXLAN.Device, err)
	}
	if !k.owned(l) {
		return nil
	}
	if err := k.h.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", k.cfg.VXLAN.Device, err)
	}
	return nil
}

// ensureDevice makes the VXLAN device match: attributes the kernel cannot
// change in place (VNI, port, local address and so family, underlay link,
// learning) make it recreate the device; MTU, MAC and the up flag are set
// in place. It returns the device's index.
func (k *Kernel) ensureDevice(local netip.Addr, link, mtu int) (int, error) {
	l, err := k.ourDevice()
	if err != nil {
		return 0, err
	}
	mac := MACFor(local)
	if l != nil {
		vx, ok := l.(*netlink.Vxlan)
		if ok && vx.VxlanId == k.cfg.VXLAN.VNI && vx.Port == k.cfg.VXLAN.Port && addrOf(vx.SrcAddr) == local &&
			vx.VtepDevIndex == link && !vx.Learning && !vx.FlowBased && vx.Group == nil {
			a := l.Attrs()
			if a.MTU != mtu {
				if err := k.h.LinkSetMTU(l, mtu); err != nil {
					return 0, fmt.Errorf("set mtu of %s to %d: %w", a.Name, mtu, err)
				}
			}
			if !bytes.Equal(a.HardwareAddr, mac) {
				if err := k.h.LinkSetHardwareAddr(l, mac); err != nil {
					return 0, fmt.Errorf("set address of %s: %w", a.Name, err)
				}
			}
			if a.Flags&net.FlagUp == 0 {
				if err := k.h.LinkSetUp(l); err != nil {
					return 0, fmt.Errorf("set %s up: %w", a.Name, err)
				}
			}
			return a.Index, nil
		}
		if err := k.h.LinkDel(l); err != nil {
			return 0, fmt.Errorf("delete %s to recreate it: %w", k.cfg.VXLAN.Device, err)
		}
	}
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{
			Name: k.cfg.VXLAN.Device, MTU: mtu, HardwareAddr: mac, TxQLen: -1,
		},
		VxlanId:      k.cfg.VXLAN.VNI,
		VtepDevIndex: link,
		SrcAddr:      local.AsSlice(),
		Port:         k.cfg.VXLAN.Port,
		Learning:     false,
	}
	if err := k.h.LinkAdd(vx); err != nil {
		return 0, fmt.Errorf("create %s (vni %d, port %d, local %s): %w", vx.Name, vx.VxlanId, vx.Port, local, err)
	}
	if err := k.h.LinkSetAlias(vx, deviceAlias); err != nil {
		return 0, fmt.Errorf("set alias of %s: %w", vx.Name, err)
	}
	if err := k.h.LinkSetUp(vx); err != nil {
		return 0, fmt.Errorf("set %s up: %w", vx.Name, err)
	}
	return vx.Index, nil
}

// syncVXLAN: see the comment at the top of the file.
func (k *Kernel) syncVXLAN(ctx context.Context, remotes []routing.Remote) ([]routing.Status, error) {
	local := routing.UnderlayAddr(k.local)
	if !local.IsValid() {
		return nil, errors.New("vxlan mode needs a local (underlay) address; this node has none")
	}
	link, mtu, err := k.underlay(local)
	if err != nil {
		return nil, err
	}
	if k.cfg.VXLAN.MTU != 0 {
		mtu = k.cfg.VXLAN.MTU
	} else {
		mtu = PodMTU(mtu, local)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dev, err := k.ensureDevice(local, link, mtu)
	if err != nil {
		return nil, err
	}
	if err := k.setRules(true); err != nil {
		return nil, err
	}
	cur, err := k.readTable()
	if err != nil {
		return nil, err
	}
	plan := k.planVXLAN(remotes, cur, local, dev)
	// Only the peers may send to the device (guard_linux.go).
	if err := k.setGuard(plan.fdb); err != nil {
		return nil, err
	}

	// Add and replace: FDB, then neighbours, then routes (which also
	// deletes stale routes), then the stale neighbours and FDB entries.
	fdb, err := k.h.NeighList(dev, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("list fdb of %s: %w", k.cfg.VXLAN.Device, err)
	}
	haveFDB := map[string]bool{}
	for _, n := range fdb {
		if n.LinkIndex == dev && n.State&netlink.NUD_PERMANENT != 0 && plan.fdb[n.HardwareAddr.String()] == addrOf(n.IP) {
			haveFDB[n.HardwareAddr.String()] = true
		}
	}
	for m, peer := range plan.fdb {
		if haveFDB[m] {
			continue
		}
		if err := k.setFDB(dev, m, peer); err != nil {
			return nil, err
		}
	}
	var neighs []netlink.Neigh
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		ns, err := k.h.NeighList(dev, fam)
		if err != nil {
			return nil, fmt.Errorf("list neighbours of %s: %w", k.cfg.VXLAN.Device, err)
		}
		neighs = append(neighs, ns...)
	}
	haveNeigh := map[netip.Addr]bool{}
	for _, n := range neighs {
		if n.LinkIndex == dev && n.State == netlink.NUD_PERMANENT && bytes.Equal(n.HardwareAddr, plan.neigh[addrOf(n.IP)]) {
			haveNeigh[addrOf(n.IP)] = true
		}
	}
	neighFailed := map[netip.Addr]error{}
	for gw, mac := range plan.neigh {
		if haveNeigh[gw] {
			continue
		}
		if err := k.setNeigh(dev, gw, mac); err != nil {
			neighFailed[gw] = err
		}
	}
	plan.dropFailed(neighFailed)
	failed, err := k.applyRoutes(cur, plan.route, false)
	if err != nil {
		return nil, err
	}
	for _, n := range neighs {
		if n.LinkIndex != dev || n.State != netlink.NUD_PERMANENT || haveNeigh[addrOf(n.IP)] {
			continue
		}
		if _, wanted := plan.neigh[addrOf(n.IP)]; wanted && neighFailed[addrOf(n.IP)] == nil {
			continue // replaced above
		}
		if err := k.h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("delete stale neighbour %s on %s: %w", n.IP, k.cfg.VXLAN.Device, err)
		}
	}
	for _, n := range fdb {
		if n.LinkIndex != dev {
			continue
		}
		if peer, ok := plan.fdb[n.HardwareAddr.String()]; ok && peer == addrOf(n.IP) {
			continue
		}
		if err := k.h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("delete stale fdb %s dst %s on %s: %w", n.HardwareAddr, n.IP, k.cfg.VXLAN.Device, err)
		}
	}
	finishVXLAN(plan.out, neighFailed, failed)

	last := &applied{mode: routing.ModeVXLAN, local: local, dev: dev,
		table: tableState{own: map[netip.Prefix][]netlink.Route{}, foreign: cur.foreign},
		fdb:   plan.fdb, neigh: map[netip.Addr]net.HardwareAddr{}, macOf: map[netip.Prefix]string{},
		macUse: map[string]int{}, gwUse: map[netip.Addr]int{}}
	last.setRoutes(cur, plan.route, failed)
	for gw, mac := range plan.neigh {
		if neighFailed[gw] == nil {
			last.neigh[gw] = mac
		}
	}
	last.setMACs(nil, plan.mac)
	k.last = last
	return plan.out, nil
}

// vxlanMAC is MACFor (a variable for the collision test: no two addresses
// are known to collide).
var vxlanMAC = MACFor

// vxlanPlan is what the vxlan mode wants for some remotes.
type vxlanPlan struct {
	out   []routing.Status                // Via set, Installed not yet
	fdb   map[string]netip.Addr           // MAC → peer
	neigh map[netip.Addr]net.HardwareAddr // gateway (block address) → MAC
	route map[netip.Prefix]*netlink.Route
	mac   map[netip.Prefix]string // block → its peer's MAC
}

func (k *Kernel) planVXLAN(remotes []routing.Remote, cur tableState, local netip.Addr, dev int) vxlanPlan {
	plan := vxlanPlan{out: make([]routing.Status, len(remotes)), fdb: map[string]netip.Addr{}, neigh: map[netip.Addr]net.HardwareAddr{},
		route: map[netip.Prefix]*netlink.Route{}, mac: map[netip.Prefix]string{}}
	out := plan.out
	owner := map[netip.Prefix]int{}
	// MACFor is a hash: two peers (or a peer and this node) whose MACs
	// collide would share one FDB entry, and one of them would draw the
	// other's traffic. Neither is routed (a node can pick its address).
	macPeers := map[string]map[netip.Addr]bool{vxlanMAC(local).String(): {local: true}}
	for _, rm := range remotes {
		if peer := addrOfFamily(rm.NodeAddrs, local.Is4()); peer.IsValid() {
			m := vxlanMAC(peer).String()
			if macPeers[m] == nil {
				macPeers[m] = map[netip.Addr]bool{}
			}
			macPeers[m][peer] = true
		}
	}
	for i, rm := range remotes {
		out[i].Remote = rm
		if out[i].Reason = claim(owner, remotes, i, cur, k.cfg.Table); out[i].Reason != "" {
			continue
		}
		peer := addrOfFamily(rm.NodeAddrs, local.Is4())
		switch {
		case len(rm.NodeAddrs) == 0:
			out[i].Reason = "node has no address"
		case !peer.IsValid():
			out[i].Reason = fmt.Sprintf("node has no %s address (the VXLAN underlay is %s)", family(local), family(local))
		case peer == local:
			out[i].Reason = fmt.Sprintf("node address %s is this node's own", peer)
		case len(macPeers[vxlanMAC(peer).String()]) > 1:
			out[i].Reason = fmt.Sprintf("node address %s gives the VXLAN MAC %s, which another node's address (or this node's) gives too", peer, vxlanMAC(peer))
		}
		if out[i].Reason != "" {
			delete(owner, rm.Block)
			continue
		}
		mac := vxlanMAC(peer)
		plan.fdb[mac.String()] = peer
		plan.mac[rm.Block] = mac.String()
		gw := rm.Block.Addr()
		plan.neigh[gw] = mac
		plan.route[rm.Block] = &netlink.Route{
			Dst: ipNet(rm.Block), Gw: gw.AsSlice(), LinkIndex: dev, Flags: int(netlink.FLAG_ONLINK),
			Table: k.cfg.Table, Protocol: netlink.RouteProtocol(k.cfg.Protocol), Type: unix.RTN_UNICAST,
		}
		out[i].Via = peer
	}
	return plan
}

// dropFailed removes the routes whose neighbour entry the kernel refused:
// no route without its neighbour.
func (p vxlanPlan) dropFailed(neighFailed map[netip.Addr]error) {
	for b, r := range p.route {
		if neighFailed[addrOf(r.Gw)] != nil {
			delete(p.route, b)
		}
	}
}

// finishVXLAN marks the planned statuses installed, or why not.
func finishVXLAN(out []routing.Status, neighFailed map[netip.Addr]error, failed map[netip.Prefix]error) {
	for i := range out {
		if out[i].Reason != "" {
			continue
		}
		gw := out[i].Block.Addr()
		switch {
		case neighFailed[gw] != nil:
			out[i].Reason = fmt.Sprintf("the kernel refused the neighbour entry for %s: %v", gw, neighFailed[gw])
		case failed[out[i].Block] != nil:
			out[i].Reason = fmt.Sprintf("the kernel refused the route: %v", failed[out[i].Block])
		default:
			out[i].Installed = true
			continue
		}
		out[i].Via = netip.Addr{}
	}
}

// setFDB adds or replaces the permanent FDB entry mac → peer.
func (k *Kernel) setFDB(dev int, mac string, peer netip.Addr) error {
	hw, _ := net.ParseMAC(mac)
	n := &netlink.Neigh{LinkIndex: dev, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, HardwareAddr: hw, IP: peer.AsSlice()}
	if err := k.h.NeighSet(n); err != nil {
		return fmt.Errorf("fdb %s dst %s: %w", mac, peer, err)
	}
	return nil
}

// setNeigh adds or replaces the permanent neighbour entry gw → mac.
func (k *Kernel) setNeigh(dev int, gw netip.Addr, mac net.HardwareAddr) error {
	fam := netlink.FAMILY_V4
	if gw.Is6() {
		fam = netlink.FAMILY_V6
	}
	return k.h.NeighSet(&netlink.Neigh{LinkIndex: dev, Family: fam, State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: mac})
}

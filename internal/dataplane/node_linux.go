package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Init installs the node-wide state: the rules "from all lookup PodTable" at
// RulePriority for IPv4 and IPv6, and, with NodeForwarding, the node's global
// forwarding switches. It is idempotent. A node without IPv6 gets only the
// IPv4 rule.
func (d *Dataplane) Init() (retErr error) {
	defer wrap(&retErr, "init", "")
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		err := d.h.RuleAdd(d.rule(family))
		switch {
		case err == nil, errors.Is(err, unix.EEXIST):
		case family == netlink.FAMILY_V6 && errors.Is(err, unix.EAFNOSUPPORT):
		default:
			return fmt.Errorf("add rule family %d prio %d table %d: %w", family, d.cfg.RulePriority, d.cfg.PodTable, err)
		}
	}
	if err := d.h.RouteReplace(d.gatewayRoute()); err != nil {
		return fmt.Errorf("local route for gateway %s: %w", d.cfg.GatewayV4, err)
	}
	if d.cfg.NodeForwarding {
		if err := netns.WriteSysctls(d.cfg.NodeNetNS,
			[2]string{"net.ipv4.ip_forward", "1"},
			[2]string{"net.ipv6.conf.all.forwarding", "1"}); err != nil {
			return err
		}
	}
	return nil
}

// Uninstall removes the rules Init added and every route in ExportTable
// tagged ExportProto. Attachments are left alone (tear them down first);
// forwarding switches are left as they are. It is idempotent.
func (d *Dataplane) Uninstall() (retErr error) {
	defer wrap(&retErr, "uninstall", "")
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		for {
			err := d.h.RuleDel(d.rule(family))
			if err == nil {
				continue // a duplicate might exist
			}
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EAFNOSUPPORT) {
				break
			}
			return fmt.Errorf("delete rule family %d: %w", family, err)
		}
	}
	if err := d.h.RouteDel(d.gatewayRoute()); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("delete gateway route: %w", err)
	}
	return d.SetExportedBlocks(nil)
}

// gatewayRoute makes GatewayV4 an address of the node without putting it on
// any interface: "local GatewayV4 dev lo table local proto PodRouteProto".
// A pod's ARP request for it arrives on a host veth and is answered there
// (a local address, arp_ignore 0); packets to it are delivered locally and
// answered from it (the kernel finds reply sources in the local table).
func (d *Dataplane) gatewayRoute() *netlink.Route {
	return &netlink.Route{
		LinkIndex: 1, // lo is always index 1 in a network namespace
		Dst:       hostNet(d.cfg.GatewayV4),
		Type:      unix.RTN_LOCAL,
		Scope:     netlink.SCOPE_HOST,
		Table:     unix.RT_TABLE_LOCAL,
		Protocol:  netlink.RouteProtocol(d.cfg.PodRouteProto),
	}
}

func (d *Dataplane) rule(family int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = family
	r.Priority = d.cfg.RulePriority
	r.Table = d.cfg.PodTable
	return r
}

// SetExportedBlocks makes ExportTable hold exactly one blackhole route,
// tagged ExportProto, per block, in both families: missing ones are added
// first, then routes tagged ExportProto that are no longer wanted are
// deleted. Routes in ExportTable with other protocols and all other tables
// are left alone. Blocks must be canonical prefixes (address bits beyond the
// length zero); duplicates are ignored. Safe to repeat.
//
// The first call reads the table (a route dump, which on a node with
// thousands of attachments means parsing every route of every table: the
// kernel does not filter dumps by table for us); later calls apply the
// difference from what the last call left, which is one route per block a
// node claims.
func (d *Dataplane) SetExportedBlocks(blocks []netip.Prefix) (retErr error) {
	defer wrap(&retErr, "export blocks", "")
	want := map[netip.Prefix]bool{}
	for _, b := range blocks {
		if !b.IsValid() || b.Addr().Zone() != "" || b.Addr().Is4In6() || b != b.Masked() {
			return fmt.Errorf("block %q is not a canonical prefix: %w", b, ErrInvalid)
		}
		want[b] = true
	}
	d.exportMu.Lock()
	defer d.exportMu.Unlock()
	if d.exported != nil {
		return d.exportDiff(want)
	}
	defer func() {
		if retErr == nil {
			d.exported = want
		}
	}()
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return d.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: d.cfg.ExportTable}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return fmt.Errorf("list table %d: %w", d.cfg.ExportTable, err)
	}
	have := map[netip.Prefix]bool{}
	var stale []netlink.Route
	for _, r := range routes {
		if int(r.Protocol) != d.cfg.ExportProto {
			continue
		}
		p, ok := routeDst(r)
		if ok && want[p] && r.Type == unix.RTN_BLACKHOLE && !have[p] {
			have[p] = true
			continue
		}
		stale = append(stale, r)
	}
	for b := range want {
		if have[b] {
			continue
		}
		if err := d.h.RouteReplace(exportRoute(d.cfg, b)); err != nil {
			return fmt.Errorf("export %s: %w", b, err)
		}
	}
	for _, r := range stale {
		p, _ := routeDst(r)
		if want[p] {
			continue // just replaced in place
		}
		if err := d.h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("withdraw %s: %w", p, err)
		}
	}
	return nil
}

// exportDiff adds the blocks in want that the last call did not leave in
// ExportTable, then withdraws the ones it no longer wants.
func (d *Dataplane) exportDiff(want map[netip.Prefix]bool) error {
	for b := range want {
		if d.exported[b] {
			continue
		}
		if err := d.h.RouteReplace(exportRoute(d.cfg, b)); err != nil {
			d.exported = nil // unsure now: the next call reads the table
			return fmt.Errorf("export %s: %w", b, err)
		}
	}
	for b := range d.exported {
		if want[b] {
			continue
		}
		if err := d.h.RouteDel(exportRoute(d.cfg, b)); err != nil && !errors.Is(err, unix.ESRCH) {
			d.exported = nil
			return fmt.Errorf("withdraw %s: %w", b, err)
		}
	}
	d.exported = want
	return nil
}

func exportRoute(c Config, b netip.Prefix) *netlink.Route {
	return &netlink.Route{
		Dst:      &net.IPNet{IP: b.Addr().AsSlice(), Mask: net.CIDRMask(b.Bits(), b.Addr().BitLen())},
		Table:    c.ExportTable,
		Protocol: netlink.RouteProtocol(c.ExportProto),
		Type:     unix.RTN_BLACKHOLE,
	}
}

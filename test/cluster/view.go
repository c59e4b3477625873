package cluster

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// What the tests read is the kernel's and the API server's, never what a
// process says of itself: a pod's address is on its eth0, a node's
// export is a route in its export table, a block is an AddressBlock.

// PodAddrs returns the addresses of interface ifName in the network
// namespace at path, link-local ones left out; none when there is no
// such interface.
func PodAddrs(path, ifName string) ([]netip.Addr, error) {
	h, closeH, err := netns.Handle(path)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer closeH()
	link, err := h.LinkByName(ifName)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s in %s: %w", ifName, path, err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses of %s in %s: %w", ifName, path, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap().IsLinkLocalUnicast() {
			continue
		}
		out = append(out, ip.Unmap())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// Exported returns the destinations of the routes in the export table
// (skeintest.ExportTable) of the node namespace at path: the blocks the
// node announces as its own.
func Exported(path string) ([]netip.Prefix, error) {
	h, closeH, err := netns.Handle(path)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer closeH()
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: skeintest.ExportTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("routes of table %d in %s: %w", skeintest.ExportTable, path, err)
	}
	var out []netip.Prefix
	for _, r := range routes {
		out = append(out, harness.RouteDst(r))
	}
	return out, nil
}

// BlockProblems checks the AddressBlocks of the API server against the
// protocol's rules: each is named <pool>-<index> with the pool label,
// has a nodeName (its owner) that its node label repeats, and no two
// blocks share an address. It returns one line per violation, naming
// the blocks and what was seen.
func BlockProblems(blocks []skeinv1.AddressBlock) []string {
	var out []string
	type held struct {
		p    netip.Prefix
		name string
	}
	var seen []held
	for i := range blocks {
		b := &blocks[i]
		pool := b.Labels[skeinv1.LabelPool]
		if b.Index < 0 || pool == "" || b.Name != skeinv1.BlockName(pool, uint32(b.Index)) {
			out = append(out, fmt.Sprintf("block %s: pool label %q, index %d: the name is not <pool>-<index>", b.Name, pool, b.Index))
		}
		if b.NodeName == "" || b.Labels[skeinv1.LabelNode] != b.NodeName {
			out = append(out, fmt.Sprintf("block %s: nodeName %q, label %s=%q: want an owner, repeated in the label",
				b.Name, b.NodeName, skeinv1.LabelNode, b.Labels[skeinv1.LabelNode]))
		}
		for _, p := range kubenode.Prefixes(b) {
			for _, s := range seen {
				if s.p.Overlaps(p) {
					out = append(out, fmt.Sprintf("blocks %s (%s) and %s (%s) overlap", s.name, s.p, b.Name, p))
				}
			}
			seen = append(seen, held{p, b.Name})
		}
	}
	return out
}

// Holding returns the block among blocks whose prefix holds addr (nil
// when none does).
func Holding(blocks []skeinv1.AddressBlock, addr netip.Addr) *skeinv1.AddressBlock {
	for i := range blocks {
		for _, p := range kubenode.Prefixes(&blocks[i]) {
			if p.Contains(addr) {
				return &blocks[i]
			}
		}
	}
	return nil
}

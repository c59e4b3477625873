package v1alpha1

import (
	"fmt"
	"net/netip"

	"github.com/skeinnet/skein/internal/ipam"
)

// Prefixes are the pool's subnets in the order blocks are numbered:
// entry by entry, each entry's IPv4 subnet before its IPv6 one. It refuses
// what the schema cannot: an unreadable subnet, and a pool that mixes
// dual-stack and single-family entries (in a dual-stack pool entry i's
// IPv4 subnet pairs with its IPv6 subnet). skeind's store, the controller,
// the webhook and skeinctl all read a pool through it, so they number its
// blocks alike.
func (p *AddressPool) Prefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	var v4, v6 bool
	single := -1 // an entry with one family
	for i, s := range p.Spec.Subnets {
		v4, v6 = v4 || s.IPv4 != nil, v6 || s.IPv6 != nil
		if single < 0 && (s.IPv4 == nil || s.IPv6 == nil) {
			single = i
		}
		for _, sub := range []*string{s.IPv4, s.IPv6} {
			if sub == nil {
				continue
			}
			pr, err := netip.ParsePrefix(*sub)
			if err != nil {
				return nil, fmt.Errorf("pool %s: subnet %d: %w", p.Name, i, err)
			}
			out = append(out, pr)
		}
	}
	if v4 && v6 && single >= 0 {
		return nil, fmt.Errorf("pool %s: entry %d of subnets has one family; in a dual-stack pool every entry needs both ipv4 and ipv6",
			p.Name, single)
	}
	return out, nil
}

// Geometry is the pool's block arithmetic (ipam.Geometry over Prefixes):
// it also refuses subnets that overlap or are smaller than a block, and
// unreadable reserved ranges.
func (p *AddressPool) Geometry() (*ipam.Geometry, error) {
	prefixes, err := p.Prefixes()
	if err != nil {
		return nil, err
	}
	g, err := ipam.NewGeometry(prefixes, int(p.Spec.BlockSizeBits), p.Spec.Reserved)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	return g, nil
}

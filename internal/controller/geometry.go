package controller

import (
	"fmt"
	"net/netip"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
)

// PoolGeometry is the block arithmetic of pool, as the embedded store
// does it: entry i's IPv4 subnet pairs with its IPv6 subnet, and blocks
// are numbered across the entries in order.
//
// It refuses what the CRD's schema cannot: a pool with dual-stack and
// single-family entries mixed, subnets that overlap or are smaller than a
// block, unreadable reserved ranges.
func PoolGeometry(pool *skeinv1.AddressPool) (*ipam.Geometry, error) {
	var prefixes []netip.Prefix
	var v4, v6 bool
	single := -1 // an entry with one family
	for i, s := range pool.Spec.Subnets {
		v4, v6 = v4 || s.IPv4 != nil, v6 || s.IPv6 != nil
		if single < 0 && (s.IPv4 == nil || s.IPv6 == nil) {
			single = i
		}
		for _, sub := range []*string{s.IPv4, s.IPv6} {
			if sub == nil {
				continue
			}
			p, err := netip.ParsePrefix(*sub)
			if err != nil {
				return nil, fmt.Errorf("pool %s: subnet %d: %w", pool.Name, i, err)
			}
			prefixes = append(prefixes, p)
		}
	}
	if v4 && v6 && single >= 0 {
		return nil, fmt.Errorf("pool %s: entry %d of subnets has one family; in a dual-stack pool every entry needs both ipv4 and ipv6",
			pool.Name, single)
	}
	g, err := ipam.NewGeometry(prefixes, int(pool.Spec.BlockSizeBits), pool.Spec.Reserved)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", pool.Name, err)
	}
	return g, nil
}

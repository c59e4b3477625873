package v1alpha1_test

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

func TestGeometry(t *testing.T) {
	dual := func(a, b string) skeinv1.SubnetSet { return skeinv1.SubnetSet{IPv4: ptr.To(a), IPv6: ptr.To(b)} }
	v4 := func(a string) skeinv1.SubnetSet { return skeinv1.SubnetSet{IPv4: ptr.To(a)} }
	v6 := func(a string) skeinv1.SubnetSet { return skeinv1.SubnetSet{IPv6: ptr.To(a)} }
	for _, c := range []struct {
		name    string
		bits    int32
		subnets []skeinv1.SubnetSet
		blocks  uint32
		block1  string // block 1's prefixes
		err     string
	}{
		{name: "v4", bits: 5, subnets: []skeinv1.SubnetSet{v4("10.0.0.0/24")}, blocks: 8, block1: "10.0.0.32/27 invalid Prefix"},
		{name: "dual, two entries", bits: 4, subnets: []skeinv1.SubnetSet{dual("10.0.0.0/28", "fd00::/124"), dual("10.1.0.0/28", "fd01::/124")},
			blocks: 2, block1: "10.1.0.0/28 fd01::/124"},
		{name: "v6 only", bits: 8, subnets: []skeinv1.SubnetSet{v6("fd00::/120")}, blocks: 1},
		{name: "mixed entries", bits: 5, subnets: []skeinv1.SubnetSet{dual("10.0.0.0/24", "fd00::/120"), v4("10.1.0.0/24")},
			err: "entry 1 of subnets has one family; in a dual-stack pool every entry needs both"},
		{name: "families split over entries", bits: 5, subnets: []skeinv1.SubnetSet{v4("10.0.0.0/24"), v6("fd00::/120")},
			err: "every entry needs both"},
		{name: "overlap", bits: 5, subnets: []skeinv1.SubnetSet{v4("10.0.0.0/16"), v4("10.0.1.0/24")}, err: "overlap"},
		{name: "smaller than a block", bits: 8, subnets: []skeinv1.SubnetSet{v4("10.0.0.0/25")}, err: "smaller than one block"},
		{name: "unparsable", bits: 5, subnets: []skeinv1.SubnetSet{v4("10.0.0.0/99")}, err: "subnet 0"},
	} {
		p := &skeinv1.AddressPool{Spec: skeinv1.AddressPoolSpec{Subnets: c.subnets, BlockSizeBits: c.bits}}
		p.Name = "p"
		g, err := p.Geometry()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want one containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if g.Blocks() != c.blocks {
			t.Errorf("%s: %d blocks, want %d", c.name, g.Blocks(), c.blocks)
		}
		if c.block1 != "" {
			a, b := g.BlockPrefixes(1)
			if got := a.String() + " " + b.String(); got != c.block1 {
				t.Errorf("%s: block 1 is %s, want %s", c.name, got, c.block1)
			}
		}
	}
}

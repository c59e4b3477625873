package egress

import (
	"net/netip"
	"testing"
)

// TestRangeElements: interval sets are written as nft(8) writes them.
func TestRangeElements(t *testing.T) {
	r := func(a, b string) addrRange { return addrRange{ip(a), ip(b)} }
	es := rangeElements([]addrRange{r("10.0.0.0", "10.255.255.255")})
	if len(es) != 3 || !es[0].IntervalEnd || netip.AddrFrom4([4]byte(es[0].Key)) != ip("0.0.0.0") ||
		es[1].IntervalEnd || netip.AddrFrom4([4]byte(es[1].Key)) != ip("10.0.0.0") ||
		!es[2].IntervalEnd || netip.AddrFrom4([4]byte(es[2].Key)) != ip("11.0.0.0") {
		t.Errorf("elements of 10.0.0.0/8: %+v", es)
	}
	if es := rangeElements([]addrRange{r("0.0.0.0", "255.255.255.255")}); len(es) != 1 || es[0].IntervalEnd {
		t.Errorf("elements of 0.0.0.0/0: %+v", es)
	}
	if es := rangeElements([]addrRange{r("::", "::1"), r("2001:db8::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}); len(es) != 3 || es[0].IntervalEnd || !es[1].IntervalEnd || es[2].IntervalEnd {
		t.Errorf("elements of ::/127 and 2001:db8::-end: %+v", es)
	}
}

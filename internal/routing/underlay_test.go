package routing

import (
	"net/netip"
	"testing"
)

// UnderlayAddr is one rule for every node: IPv4 when there is one, else
// IPv6, whatever the order of the addresses.
func TestUnderlayAddr(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	for _, c := range []struct {
		addrs []netip.Addr
		want  netip.Addr
	}{
		{[]netip.Addr{v4, v6}, v4},
		{[]netip.Addr{v6, v4}, v4},
		{[]netip.Addr{v6}, v6},
		{[]netip.Addr{v4}, v4},
		{nil, netip.Addr{}},
	} {
		if got := UnderlayAddr(c.addrs); got != c.want {
			t.Errorf("UnderlayAddr(%v) = %v, want %v", c.addrs, got, c.want)
		}
	}
}

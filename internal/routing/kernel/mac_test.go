package kernel_test

import (
	"net/netip"
	"testing"

	"github.com/skeinnet/skein/internal/routing/kernel"
)

func TestMACFor(t *testing.T) {
	seen := map[string]string{}
	for _, s := range []string{"10.0.0.1", "10.0.0.2", "192.168.50.1", "fd50::1", "fd50::2", "::ffff:10.0.0.3"} {
		a := netip.MustParseAddr(s)
		m := kernel.MACFor(a)
		if len(m) != 6 || m[0]&0x01 != 0 || m[0]&0x02 == 0 {
			t.Errorf("MACFor(%s) = %s: want a locally administered unicast MAC", a, m)
		}
		if other, dup := seen[m.String()]; dup {
			t.Errorf("MACFor(%s) = MACFor(%s) = %s", a, other, m)
		}
		seen[m.String()] = s
	}
	// Pinned: every node of a cluster, whatever its skeind version, must
	// derive the same MAC for a peer (checked by hand: the first six bytes
	// of SHA-256("skein vxlan " + the 16-byte address), bit 0x02 set, 0x01
	// clear).
	for s, want := range map[string]string{"10.0.0.1": "2e:8e:8f:d3:9a:05", "fd50::1": "c6:11:16:ae:82:4d"} {
		if got := kernel.MACFor(netip.MustParseAddr(s)).String(); got != want {
			t.Errorf("MACFor(%s) = %s, want %s (the derivation changed: nodes of different versions would not reach each other)", s, got, want)
		}
	}
	if kernel.MACFor(netip.MustParseAddr("::ffff:10.0.0.1")).String() != kernel.MACFor(netip.MustParseAddr("10.0.0.1")).String() {
		t.Error("a mapped IPv4 address gets another MAC than the IPv4 address")
	}
}

func TestPodMTU(t *testing.T) {
	for _, c := range []struct {
		mtu  int
		addr string
		want int
	}{
		{1500, "10.0.0.1", 1450},
		{1500, "fd00::1", 1430},
		{9000, "10.0.0.1", 8950},
	} {
		if got := kernel.PodMTU(c.mtu, netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("PodMTU(%d, %s) = %d, want %d", c.mtu, c.addr, got, c.want)
		}
	}
}

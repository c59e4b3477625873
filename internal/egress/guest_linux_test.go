package egress

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/skeinnet/skein/test/guest"
)

// The data-plane tests need fou, ipip and ip6_tunnel, which this host's
// kernel lacks: TestEgressInGuest runs the inner tests (TestGuest*, each
// starting with requireGuest) inside the qemu guest of test/guest, and
// BenchmarkEgressInGuest (make bench-egress) runs BenchmarkGuestEgress
// there.

// guestModules are what the inner tests use: the tunnels, veth pairs,
// nftables NAT (the routers' masquerade, the kube-proxy emulation's DNAT
// and numgen) and conntrack over netlink (Stats, the emulated endpoint
// flush). Nothing is auto-loaded in the guest; crc32c_generic is the
// soft dependency of libcrc32c that nf_conntrack needs.
var guestModules = func() []string {
	m := []string{"crc32c_generic"}
	m = append(m, guest.TunnelModules...)
	m = append(m, guest.VethModules...)
	m = append(m, guest.NftablesModules...)
	return append(m, "nf_conntrack_netlink")
}()

func requireGuest(t testing.TB) {
	t.Helper()
	guest.RequireGuest(t)
}

// TestEgressInGuest runs the inner tests; $SKEIN_EGRESS_GUEST_RUN, when
// set, is the -test.run regexp instead of "^TestGuest" (to iterate on a
// few: SKEIN_EGRESS_GUEST_RUN='^TestGuestRouterPeers$').
func TestEgressInGuest(t *testing.T) {
	run := "^TestGuest"
	if r := os.Getenv("SKEIN_EGRESS_GUEST_RUN"); r != "" {
		run = r
	}
	guest.Run(t, guest.Config{Package: "./internal/egress", Run: run, Modules: guestModules})
}

func BenchmarkEgressInGuest(b *testing.B) {
	res := guest.Run(b, guest.Config{
		Package: "./internal/egress", Run: "^$", Bench: "^BenchmarkGuestEgress$", BenchTime: "1x",
		Modules: guestModules,
	})
	for _, l := range strings.Split(res.Output, "\n") {
		if strings.HasPrefix(l, "EGRESS-BENCH") || strings.HasPrefix(l, "BenchmarkGuestEgress") {
			fmt.Println(l)
		}
	}
}

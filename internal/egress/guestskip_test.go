package egress

import (
	"os"
	"testing"
)

// requireGuest skips unless the test runs inside the qemu guest.
// TODO: replace with guest.RequireGuest once test/guest is on main.
func requireGuest(t testing.TB) {
	t.Helper()
	if os.Getenv("SKEIN_EGRESS_GUEST") != "1" {
		t.Skip("skipping: needs the qemu guest's kernel (fou, ipip, ip6_tunnel); TestEgressInGuest runs it")
	}
}

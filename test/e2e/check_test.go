package e2e

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestCheckDetectsDamage: CHECK must notice what ADD set up and is no longer
// there, and say so with skein's code 110; DEL still cleans up.
func TestCheckDetectsDamage(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "check", "1.1.0", nil)
	const podTable = 116

	for _, c := range []struct {
		name   string
		damage func(t *testing.T, p *pod)
	}{
		{"pod address removed", func(t *testing.T, p *pod) {
			h := p.ns.Handle(t)
			link, err := h.LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			a := p.addr(false)
			if err := h.AddrDel(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				t.Fatalf("remove %s from the pod: %v", a, err)
			}
		}},
		{"host route removed", func(t *testing.T, p *pod) {
			h := e.d.Node.Handle(t)
			host, err := h.LinkByName(p.res.Interfaces[0].Name)
			if err != nil {
				t.Fatal(err)
			}
			a := p.addr(true)
			r := &netlink.Route{LinkIndex: host.Attrs().Index, Table: podTable, Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(128, 128)}}
			if err := h.RouteDel(r); err != nil {
				t.Fatalf("remove the host route to %s from table %d: %v", a, podTable, err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := e.mustAdd(t, l, harness.NewNS(t, "pod"), "ctr")
			if err := e.check(t, l, p.rt); err != nil {
				t.Fatalf("CHECK before any damage: expected success, got: %v", err)
			}
			c.damage(t, p)
			wantCode(t, "CHECK after "+c.name, e.check(t, l, p.rt), 110)
			e.mustDel(t, l, p.rt)
			e.assertNothingLeft(t)
		})
	}
}

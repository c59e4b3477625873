package egress

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
)

// TestGuestApplyClientUntaggedLeftover: a call that died between creating
// a pod's tunnel and tagging it leaves an untagged device of that name;
// the next ApplyClient replaces it instead of failing with ErrNameClash
// for good. A failing call removes it and restores everything else; a
// device of another kind with such a name still clashes.
func TestGuestApplyClientUntaggedLeftover(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	pod := tp.client
	h := pod.Handle(t)
	// The gateway's IPv4 tunnel as a crashed call made it (FoU, not
	// tagged; an older ServiceIP, so it differs from what is wanted) and
	// the IPv6 flow-based device, untagged too.
	left4 := tunnel{name: clientTunnelName(false, "default", "egress"), remote: ip("10.96.0.77"), local: client4, sport: DefaultPort, dport: DefaultPort}
	left6 := tunnel{name: flowDevice6, v6: true, flow: true}
	leave := func(ts ...tunnel) {
		t.Helper()
		for _, l := range ts {
			if err := h.LinkAdd(l.link()); err != nil {
				t.Fatalf("the untagged leftover %s: %v", l.name, err)
			}
			if x, err := h.LinkByName(l.name); err != nil || x.Attrs().Alias != "" || x.Type() != l.kind() {
				t.Fatalf("the leftover %s: %v, %v; want an untagged %s", l.name, x, err, l.kind())
			}
		}
	}

	// A later failure (a veth holds another gateway's name): the call
	// fails with ErrNameClash, the leftover is gone, nothing else changed.
	cfg := gateway(false, "0.0.0.0/0", "::/0")
	b := Gateway{Namespace: "zz", Name: "gw", ServiceIPs: []netip.Addr{ip("10.96.0.51")}, Destinations: []netip.Prefix{pfx("198.51.100.0/24")}}
	clash := clientTunnelName(false, "zz", "gw")
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: clash}, PeerName: "clashpeer"}); err != nil {
		t.Fatal(err)
	}
	clean := harness.Snapshot(t, pod)
	leave(left4)
	err := ApplyClient(pod.Path(), ClientConfig{Gateways: []Gateway{cfg.Gateways[0], b}})
	if !errors.Is(err, ErrNameClash) {
		t.Fatalf("leftover and a clash: err = %v, want ErrNameClash", err)
	}
	harness.AssertSame(t, clean, harness.Snapshot(t, pod))
	if st, err := ClientState(pod.Path()); err != nil || !st.Empty() {
		t.Errorf("after the failed apply: %+v, %v; want nothing", st, err)
	}
	if err := h.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: clash}}); err != nil {
		t.Fatal(err)
	}

	// Leftovers only: replaced, and the gateway works.
	leave(left4, left6)
	if err := ApplyClient(pod.Path(), cfg); err != nil {
		t.Fatalf("ApplyClient over untagged leftovers: %v", err)
	}
	st, err := ClientState(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	checkState(t, st, false)
	for _, dst := range []netip.Addr{ext4, ext6} {
		for _, proto := range []string{"tcp", "udp"} {
			mustVia(t, tp, proto, dst)
		}
	}
	if err := ApplyClient(pod.Path(), ClientConfig{}); err != nil {
		t.Fatalf("ApplyClient(zero): %v", err)
	}
	if st, err := ClientState(pod.Path()); err != nil || !st.Empty() {
		t.Errorf("after the zero config: %+v, %v; want nothing", st, err)
	}
}

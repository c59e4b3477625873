package egress

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
)

// Router-side guest tests found by review (see dataplane_guest_test.go for
// the main ones).

func conntrackSum(t *testing.T, tp *topo) int {
	t.Helper()
	n := 0
	for _, s := range stats(t, tp) {
		n += s.ConntrackEntries
	}
	return n
}

// listenIn starts a TCP server in ns that answers "ok" and closes.
func listenIn(t *testing.T, ns *harness.NS, addr string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() error { var err error; ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
}

func dialIn(ns *harness.NS, to netip.AddrPort) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", to.String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(c)
		return err
	})
}

// TestGuestRouterConntrackCount: ConntrackEntries counts the sessions the
// router SNATs for its clients and nothing else: not the FoU flows that
// carry them, not a client's direct connection to the router pod (a
// Prometheus pod that is itself an egress client scraping the router).
func TestGuestRouterConntrackCount(t *testing.T) {
	requireTunnels(t)
	tp := newTopo(t, false)
	if err := ApplyClient(tp.client.Path(), gateway(false, "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	for i := range tp.routers {
		listenIn(t, tp.routers[i], ":7020")
		for _, a := range []netip.Addr{router4[i], router6[i]} {
			if err := dialIn(tp.client, netip.AddrPortFrom(a, 7020)); err != nil {
				t.Fatalf("the client to router %d directly (%s): %v", i+1, a, err)
			}
		}
	}
	if n := conntrackSum(t, tp); n != 0 {
		t.Errorf("after the client's direct connections to the routers: %d conntrack entries counted, want 0", n)
	}
	mustVia(t, tp, "udp", ext4)
	if n := conntrackSum(t, tp); n != 1 {
		t.Errorf("after one UDP exchange through the gateway: %d conntrack entries counted, want 1 (the SNAT'd flow, not its FoU carrier)", n)
	}
	mustVia(t, tp, "tcp", ext6)
	if n := conntrackSum(t, tp); n != 2 {
		t.Errorf("after a TCP connection through the gateway too: %d conntrack entries counted, want 2", n)
	}
}

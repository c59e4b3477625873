package egress

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// withoutModule unloads the kernel module name for the rest of the test
// and loads it again (from the guest's module directory) at cleanup.
func withoutModule(t *testing.T, name string) {
	t.Helper()
	if _, err := os.Stat("/sys/module/" + name); err != nil {
		t.Skipf("skipping: %s is not a loaded module in this guest: %v", name, err)
	}
	ko := "/lib/modules/skein/" + name + ".ko"
	if _, err := os.Stat(ko); err != nil {
		t.Skipf("skipping: no %s to load %s again: %v", ko, name, err)
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// Namespaces of earlier tests may still be going away.
		if err = unix.DeleteModule(name, unix.O_NONBLOCK); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("unload %s: %v", name, err)
	}
	t.Cleanup(func() {
		f, err := os.Open(ko)
		if err == nil {
			err = unix.FinitModule(int(f.Fd()), "", 0)
			f.Close()
		}
		if err != nil {
			t.Errorf("load %s again: %v", name, err)
		}
	})
}

// TestGuestNoFoU6: on a kernel with fou but without fou6 (which nothing
// loads on demand), IPv6 tunnels fail with ErrNotSupported naming fou6,
// and the client pod is left as it was.
func TestGuestNoFoU6(t *testing.T) {
	requireTunnels(t)
	withoutModule(t, "fou6")
	node := harness.NewNS(t, "egnode")
	pod, rns := harness.NewNS(t, "egpod"), harness.NewNS(t, "egrouter")
	plugPod(t, node, pod, "vnofou6", client4, client6)
	plugPod(t, node, rns, "vnofou6r", router4[0], router6[0])

	before := harness.Snapshot(t, pod)
	err := ApplyClient(pod.Path(), gateway(false, "0.0.0.0/0", "::/0"))
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "fou6 module not available") {
		t.Errorf("ApplyClient without fou6: err = %v, want ErrNotSupported naming fou6", err)
	}
	harness.AssertSame(t, before, harness.Snapshot(t, pod))

	r, err := NewRouter(RouterConfig{NetNS: rns.Path(), Local4: router4[0], Local6: router6[0]})
	if err != nil {
		t.Fatalf("NewRouter without fou6 (receiving needs only fou): %v", err)
	}
	defer r.Close()
	err = r.SyncPeers([]netip.Addr{client4, client6})
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "fou6 module not available") {
		t.Errorf("SyncPeers with an IPv6 peer without fou6: err = %v, want ErrNotSupported naming fou6", err)
	}
	if got := r.Peers(); len(got) != 1 || got[0] != client4 {
		t.Errorf("peers with a tunnel = %v, want the IPv4 one only", got)
	}
}

package e2e

import (
	"testing"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestStatus (CNI 1.1.0): STATUS succeeds while skeind serves the network's
// pool and fails with 50 (plugin not available) when the pool is missing
// or full or skeind is down; ADD and DEL ask to try again (11) meanwhile.
func TestStatus(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "status", "1.1.0", nil)
	status := func() error { return e.cni.GetStatusNetworkList(ctx(t), l) }

	if err := status(); err != nil {
		t.Errorf("STATUS with skeind running: the spec expects success, got: %v", err)
	}
	wantCode(t, "STATUS of a network whose pool does not exist",
		e.cni.GetStatusNetworkList(ctx(t), e.list(t, "status", "1.1.0", skeintest.Plugin{"pool": "no-such-pool"})), 50)

	// A pool of one block with two usable addresses.
	e.createPool(t, "two", 2, "10.98.0.0/30")
	two := e.list(t, "status-two", "1.1.0", skeintest.Plugin{"pool": "two"})
	var full []*pod
	for _, id := range []string{"t1", "t2"} {
		full = append(full, e.mustAdd(t, two, harness.NewNS(t, "pod"), id))
	}
	wantCode(t, "STATUS of a network whose pool is full", e.cni.GetStatusNetworkList(ctx(t), two), 50)
	e.mustDel(t, two, full[0].rt)
	if err := e.cni.GetStatusNetworkList(ctx(t), two); err != nil {
		t.Errorf("STATUS once the pool has room again: expected success, got: %v", err)
	}
	e.mustDel(t, two, full[1].rt)

	e.d.Stop(t)
	wantCode(t, "STATUS with skeind stopped", status(), 50)
	ns := harness.NewNS(t, "pod")
	wantCode(t, "ADD with skeind stopped", func() error { _, err := e.add(t, l, skeintest.RT("down", ns.Path(), "eth0")); return err }(), 11)
	wantCode(t, "DEL with skeind stopped", e.del(t, l, skeintest.RT("down", ns.Path(), "eth0")), 11)

	e.d.Start(t)
	if err := status(); err != nil {
		t.Errorf("STATUS after skeind is back: expected success, got: %v", err)
	}
	e.assertNothingLeft(t)
}

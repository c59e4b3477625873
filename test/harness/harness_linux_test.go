package harness_test

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

func TestNewNSCleansUp(t *testing.T) {
	harness.RequireRoot(t)
	var path string
	t.Run("inner", func(t *testing.T) {
		ns := harness.NewNS(t, "cleanup")
		path = ns.Path()
		if err := netns.IsNetNS(path); err != nil {
			t.Fatal(err)
		}
		lo, err := ns.Handle(t).LinkByName("lo")
		if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("lo not up: %v", err)
		}
	})
	if err := netns.IsNetNS(path); err == nil {
		t.Errorf("%s still exists after the subtest", path)
	}
}

func TestExecRunsInside(t *testing.T) {
	harness.RequireRoot(t)
	ns := harness.NewNS(t, "exec")
	out, err := ns.Exec(t, "cat", "/proc/self/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	// A fresh namespace has exactly one interface: lo.
	if n := strings.Count(out, ":"); n != 1 || !strings.Contains(out, "lo:") {
		t.Errorf("/proc/self/net/dev inside: %q", out)
	}
	if _, err := ns.Exec(t, "false"); err == nil {
		t.Error("Exec of a failing command returned no error")
	}
}

func TestPing(t *testing.T) {
	harness.RequireRoot(t)
	ns := harness.NewNS(t, "ping")
	for _, a := range []string{"127.0.0.1", "::1"} {
		if err := harness.Ping(t, ns, netip.MustParseAddr(a)); err != nil {
			t.Errorf("ping %s: %v", a, err)
		}
	}
	if err := harness.Ping(t, ns, netip.MustParseAddr("192.0.2.1")); err == nil {
		t.Error("ping with no route succeeded")
	}
}

// recorder captures Errorf calls so AssertSame's failures can be tested.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

func TestSnapshotAssertSame(t *testing.T) {
	harness.RequireRoot(t)
	ns := harness.NewNS(t, "snap")
	before := harness.Snapshot(t, ns)
	rec := &recorder{TB: t}
	harness.AssertSame(rec, before, harness.Snapshot(t, ns))
	if len(rec.errs) != 0 {
		t.Errorf("identical snapshots differ: %v", rec.errs)
	}

	h := ns.Handle(t)
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "va", TxQLen: -1, Flags: net.FlagUp}, PeerName: "vb"}
	if err := h.LinkAdd(v); err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(v, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 0, 0, 1).To4(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: v.Index, Dst: &net.IPNet{IP: net.IPv4(10, 9, 0, 0).To4(), Mask: net.CIDRMask(16, 32)}, Table: 77}); err != nil {
		t.Fatal(err)
	}
	r := netlink.NewRule()
	r.Priority, r.Table = 1234, 77
	if err := h.RuleAdd(r); err != nil {
		t.Fatal(err)
	}
	harness.AssertSame(rec, before, harness.Snapshot(t, ns))
	got := strings.Join(rec.errs, "\n")
	for _, want := range []string{"links changed", "va type=veth", "10.0.0.1/32 dev va", "table 77", "prio 1234"} {
		if !strings.Contains(got, want) {
			t.Errorf("AssertSame report lacks %q:\n%s", want, got)
		}
	}
}

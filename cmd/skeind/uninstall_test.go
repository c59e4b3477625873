package main

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
	"github.com/skeinnet/skein/test/harness"
)

// TestUninstall: skeind --uninstall takes away everything skeind keeps in
// the node's namespace when it stops, in vxlan mode the most of it (the
// dataplane's rules, gateway and exported blocks; the routing rule, table
// 120's routes, the VXLAN device and its nftables guard), so that another
// CNI on the same pod range is not shadowed by table 120. The namespace is
// as it was before skeind, and a second run is a no-op.
func TestUninstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	node := harness.NewNS(t, "uninst")
	h := node.Handle(t)
	// The underlay address on lo: enough for the VXLAN device.
	ul, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(ul); err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(ul, &netlink.Addr{IPNet: netlink.NewIPNet(netip.MustParseAddr("192.0.2.1").AsSlice())}); err != nil {
		t.Fatal(err)
	}
	before := harness.Snapshot(t, node)

	cfg := daemon.Config{Dataplane: dataplane.Config{NodeNetNS: node.Path(), MTU: 1500}}
	dp, err := dataplane.New(cfg.Dataplane)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Init(); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetExportedBlocks([]netip.Prefix{netip.MustParsePrefix("10.64.0.0/27")}); err != nil {
		t.Fatal(err)
	}
	dp.Close()
	k, err := kernel.NewKernel(kernel.KernelConfig{Mode: routing.ModeVXLAN, NodeNetNS: node.Path(),
		LocalAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Sync(t.Context(), []routing.Remote{{Block: netip.MustParsePrefix("10.64.0.32/27"), Name: "b", Node: "n2",
		NodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}}}); err != nil {
		t.Fatal(err)
	}
	k.Close()
	if during := harness.Snapshot(t, node); len(during.Rules) == len(before.Rules) || len(during.Links) == len(before.Links) ||
		len(nftTables(t, node)) == 0 {
		t.Fatalf("skeind's state made no difference to the namespace: the test checks nothing (%+v, nftables %q)", during, nftTables(t, node))
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 2; i++ {
		if err := uninstallNode(cfg, log); err != nil {
			t.Fatalf("uninstall #%d: %v", i+1, err)
		}
		harness.AssertSame(t, before, harness.Snapshot(t, node))
		if tables := nftTables(t, node); len(tables) != 0 {
			t.Errorf("nftables tables left: %q", tables)
		}
	}
}

// nftTables lists the nftables tables of ns.
func nftTables(t *testing.T, ns *harness.NS) []string {
	t.Helper()
	var out []string
	if err := ns.Do(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tables, err := c.ListTables()
		for _, tb := range tables {
			out = append(out, tb.Name)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

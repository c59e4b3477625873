package pack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/test/harness"
)

// TestCapabilitiesNeeded measures which of sandbox.PluginCapabilities the
// reference plugins need: each plugin's add and del run through the
// sandbox with the whole set, then with each capability taken away in
// turn. With the whole set everything works; without CAP_NET_ADMIN or
// CAP_SYS_ADMIN every plugin fails. The others are logged: none of these
// plugins needs CAP_NET_RAW or CAP_NET_BIND_SERVICE (the set keeps them for
// plugins this test cannot run: DHCP's packet sockets, a main exec serving
// on a low port).
func TestCapabilitiesNeeded(t *testing.T) {
	harness.RequireRoot(t)
	before := harness.HostNet(t)
	// (ipvlan and vlan would belong here, but the test machine's kernel
	// has neither link type.)
	plugins := []string{"bridge", "host-local", "macvlan", "ptp", "loopback"}
	archive, _ := writeArchive(t, Options{Plugins: pluginPaths(t, plugins...), Shim: shimPath(t)})
	img := acquire(t, image.Source{Image: "file://" + archive})

	node := harness.NewNS(t, "node")
	peer := harness.NewNS(t, "peer")
	node.AddVeth(t, harness.Veth{Name: "uplink", PeerName: "eth0", Peer: peer})
	peer.AddAddr(t, "eth0", netip.MustParsePrefix("10.88.0.1/24"))

	configs := []struct{ name, ifname, config string }{
		{"bridge", "net1", `{"cniVersion":"1.0.0","name":"c1","type":"bridge","bridge":"kbr-caps","isGateway":true,"ipam":{"type":"host-local","subnet":"10.77.0.0/24"}}`},
		{"ptp", "net2", `{"cniVersion":"1.0.0","name":"c2","type":"ptp","ipam":{"type":"host-local","subnet":"10.78.0.0/24"}}`},
		{"macvlan", "net3", `{"cniVersion":"1.0.0","name":"c3","type":"macvlan","master":"uplink","ipam":{"type":"host-local","subnet":"10.88.0.0/24","rangeStart":"10.88.0.10"}}`},
		{"loopback", "lo", `{"cniVersion":"1.0.0","name":"c6","type":"loopback"}`},
	}
	names := map[int]string{unix.CAP_NET_ADMIN: "CAP_NET_ADMIN", unix.CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
		unix.CAP_NET_RAW: "CAP_NET_RAW", unix.CAP_NET_BIND_SERVICE: "CAP_NET_BIND_SERVICE"}

	// run adds and deletes every plugin in a fresh pod with caps; it
	// returns the plugins that failed.
	run := func(t *testing.T, caps []int) (failed []string) {
		sb, err := sandbox.New(sandbox.Options{ScratchDir: t.TempDir(), NodeNetNS: node.Path(), Prestart: -1, Capabilities: caps})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close()
		pod := harness.NewNS(t, "pod")
		const id = "0b5f3c1e-2a4d-4c8e-9b7a-6d1e0f2a3b4c"
		for _, c := range configs {
			state := t.TempDir()
			t.Cleanup(func() { sb.ReleaseState(state) }) // a tmpfs, kept past Close
			p := sandbox.Plugin{Rootfs: img.Root, Config: []byte(c.config), StateDir: state}
			_, addErr := sb.Run(context.Background(), p.Call(sandbox.OpAdd, pod.Path(), id, c.ifname))
			_, delErr := sb.Run(context.Background(), p.Call(sandbox.OpDel, pod.Path(), id, c.ifname))
			if addErr != nil || delErr != nil {
				failed = append(failed, c.name)
				t.Logf("%s: add: %v; del: %v", c.name, addErr, delErr)
			}
		}
		return failed
	}

	t.Run("all", func(t *testing.T) {
		if failed := run(t, sandbox.PluginCapabilities); len(failed) > 0 {
			t.Errorf("with %v: %v failed", sandbox.PluginCapabilities, failed)
		}
	})
	var report []string
	for _, c := range sandbox.PluginCapabilities {
		t.Run("without-"+names[c], func(t *testing.T) {
			caps := slices.DeleteFunc(slices.Clone(sandbox.PluginCapabilities), func(x int) bool { return x == c })
			failed := run(t, caps)
			report = append(report, fmt.Sprintf("without %s: %d of %d fail %v", names[c], len(failed), len(configs), failed))
			if (c == unix.CAP_NET_ADMIN || c == unix.CAP_SYS_ADMIN) && len(failed) != len(configs) {
				t.Errorf("without %s only %v failed; want every plugin to need it", names[c], failed)
			}
		})
	}
	t.Logf("measured:\n%s", strings.Join(report, "\n"))
	harness.AssertHostSame(t, before, "after the capability runs")
}

package pack

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/test/harness"
)

// TestSandboxedPlugins: the packed reference plugins, called through the
// sandbox as skeind calls them (own mount namespace, read-only image root,
// the node's network namespace), give a pod a bridge interface (host-local
// keeping its reservations in the network's state directory through the
// image's /var/lib/cni link, no dataDir in the config) and a macvlan
// interface over the node's uplink; each reaches its peer. Del removes
// both and frees the addresses; the host's network is not touched.
func TestSandboxedPlugins(t *testing.T) {
	harness.RequireRoot(t)
	before := harness.HostNet(t)
	archive, _ := writeArchive(t, Options{Plugins: pluginPaths(t, refPlugins...), Shim: shimPath(t)})
	img := acquire(t, image.Source{Image: "file://" + archive})

	node := harness.NewNS(t, "node")
	pod := harness.NewNS(t, "pod")
	peer := harness.NewNS(t, "peer")
	node.AddVeth(t, harness.Veth{Name: "uplink", PeerName: "eth0", Peer: peer})
	peer.AddAddr(t, "eth0", netip.MustParsePrefix("10.88.0.1/24"))

	sb, err := sandbox.New(sandbox.Options{ScratchDir: t.TempDir(), NodeNetNS: node.Path(), Prestart: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })

	const id = "6c2d8f0e-8a4b-4b3e-9f51-0d5a2c7e9b11"
	nets := []struct {
		ifname, config string
		want, peer     string
	}{
		{"net1", `{"cniVersion":"1.0.0","name":"blue","type":"bridge","bridge":"kbr-blue","isGateway":true,"ipam":{"type":"host-local","subnet":"10.77.0.0/24"}}`,
			"10.77.0.2/24", "10.77.0.1"},
		{"net2", `{"cniVersion":"1.0.0","name":"green","type":"macvlan","master":"uplink","mode":"bridge","ipam":{"type":"host-local","subnet":"10.88.0.0/24","rangeStart":"10.88.0.10"}}`,
			"10.88.0.10/24", "10.88.0.1"},
	}
	states := map[string]string{}
	for _, n := range nets {
		states[n.ifname] = t.TempDir()
		dir := states[n.ifname]
		t.Cleanup(func() { sb.ReleaseState(dir) }) // a tmpfs, kept past Close
		p := sandbox.Plugin{Rootfs: img.Root, Config: []byte(n.config), StateDir: states[n.ifname]}
		res, err := sb.Run(context.Background(), p.Call(sandbox.OpAdd, pod.Path(), id, n.ifname))
		if err != nil {
			t.Fatalf("add %s: %v", n.ifname, err)
		}
		var r struct {
			IPs []struct{ Address string } `json:"ips"`
		}
		if err := json.Unmarshal(res.Stdout, &r); err != nil || len(r.IPs) != 1 || r.IPs[0].Address != n.want {
			t.Fatalf("add %s: result %s (%v), want %s", n.ifname, res.Stdout, err, n.want)
		}
		if err := harness.Ping(t, pod, netip.MustParseAddr(n.peer)); err != nil {
			t.Errorf("%s: pod → %s: %v", n.ifname, n.peer, err)
		}
		addr := netip.MustParsePrefix(n.want).Addr().String()
		name := map[string]string{"net1": "blue", "net2": "green"}[n.ifname]
		if _, err := os.Stat(filepath.Join(states[n.ifname], "networks", name, addr)); err != nil {
			t.Errorf("%s: host-local's reservation not in the state directory: %v", n.ifname, err)
		}
	}
	if _, err := node.Handle(t).LinkByName("kbr-blue"); err != nil {
		t.Errorf("the bridge is not in the node namespace: %v", err)
	}

	for i := len(nets) - 1; i >= 0; i-- {
		n := nets[i]
		p := sandbox.Plugin{Rootfs: img.Root, Config: []byte(n.config), StateDir: states[n.ifname]}
		for range 2 { // del is idempotent
			if _, err := sb.Run(context.Background(), p.Call(sandbox.OpDel, pod.Path(), id, n.ifname)); err != nil {
				t.Fatalf("del %s: %v", n.ifname, err)
			}
		}
		if _, err := pod.Handle(t).LinkByName(n.ifname); err == nil {
			t.Errorf("%s still in the pod", n.ifname)
		}
		addr := netip.MustParsePrefix(n.want).Addr().String()
		if ents, _ := filepath.Glob(filepath.Join(states[n.ifname], "networks", "*", addr)); len(ents) != 0 {
			t.Errorf("%s: address still reserved: %v", n.ifname, ents)
		}
	}
	harness.AssertHostSame(t, before, "after sandboxed plugins")
}

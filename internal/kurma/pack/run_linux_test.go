package pack

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/test/harness"
)

// runShim runs the unpacked image's add or del directly (no sandbox) in
// the node namespace: the shim finds the plugins beside itself.
func runShim(t *testing.T, node *harness.NS, root, op, state string, args []string, config string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := node.Do(func() error {
		cmd := exec.Command(filepath.Join(root, "opt/network", op), args...)
		cmd.Stdin = strings.NewReader(config)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Env = []string{"SKEIN_NETPLUGIN_STATE=" + state}
		return cmd.Run()
	})
	if err != nil {
		return stdout.String(), &runError{err, stdout.String() + stderr.String()}
	}
	return stdout.String(), nil
}

type runError struct {
	err error
	out string
}

func (e *runError) Error() string { return e.err.Error() + ": " + e.out }

// TestShimBridgeDirect: the packed bridge + host-local, run through the
// shim in a node namespace, give a pod an interface that reaches the
// bridge; del removes it and frees the address; del again succeeds. The
// host's network is not touched.
func TestShimBridgeDirect(t *testing.T) {
	harness.RequireRoot(t)
	before := harness.HostNet(t)
	archive, _ := writeArchive(t, Options{Plugins: pluginPaths(t, "bridge", "host-local"), Shim: shimPath(t)})
	img := acquire(t, image.Source{Image: "file://" + archive})
	node := harness.NewNS(t, "node")
	pod := harness.NewNS(t, "pod")
	state := t.TempDir()
	ipam := filepath.Join(state, "ipam")
	config := `{"cniVersion":"1.0.0","name":"net1","type":"bridge","bridge":"kbr-` + harness.RandHex(3) + `","isGateway":true,
		"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":"` + ipam + `"}}`
	args := []string{pod.Path(), "0e4f2c1a-6f1b-4d7e-9d3b-7c0a1f2e3d4c", "net1"}

	out, err := runShim(t, node, img.Root, "add", state, args, config)
	if err != nil {
		t.Fatalf("add: %v", err)
	}
	var res struct {
		IPs []struct{ Address string } `json:"ips"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.IPs) != 1 || res.IPs[0].Address != "10.77.0.2/24" {
		t.Fatalf("add result %s (%v)", out, err)
	}
	if _, err := pod.Handle(t).LinkByName("net1"); err != nil {
		t.Fatalf("pod has no net1: %v", err)
	}
	if err := harness.Ping(t, pod, netip.MustParseAddr("10.77.0.1")); err != nil {
		t.Errorf("pod → bridge: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ipam, "net1", "10.77.0.2")); err != nil {
		t.Errorf("host-local reservation: %v", err)
	}

	for i := range 2 {
		if _, err := runShim(t, node, img.Root, "del", state, args, config); err != nil {
			t.Fatalf("del #%d: %v", i+1, err)
		}
	}
	if _, err := pod.Handle(t).LinkByName("net1"); err == nil {
		t.Error("net1 still in the pod after del")
	}
	if _, err := os.Stat(filepath.Join(ipam, "net1", "10.77.0.2")); !os.IsNotExist(err) {
		t.Errorf("address not released: %v", err)
	}
	harness.AssertHostSame(t, before, "after the bridge add/del")
}

// TestRegistryRoundTrip: the packed image pushed to the real
// distribution registry comes back through docker://…@sha256 with the
// manifest digest Build reports.
func TestRegistryRoundTrip(t *testing.T) {
	host := startRegistry(t)
	img, err := Build(Options{Plugins: pluginPaths(t, "ptp", "host-local"), Shim: shimPath(t)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host+"/skein/cni-ptp:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithContext(context.Background())); err != nil {
		t.Fatalf("push: %v", err)
	}
	got := acquire(t, image.Source{Image: "docker://" + host + "/skein/cni-ptp@" + d.String()})
	if got.Digest != d.String() {
		t.Errorf("digest %s, want %s", got.Digest, d)
	}
	for _, p := range []string{AddPath, DelPath, PluginDir + "/ptp", PluginDir + "/host-local", "/lib/x86_64-linux-gnu/libc.so.6"} {
		if _, err := os.Stat(filepath.Join(got.Root, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

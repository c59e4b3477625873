package kurma

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/api/rpcwire"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// callTimeout bounds one libcni call.
const callTimeout = 60 * time.Second

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// archive is a packed plugin image and the sha256 of its bytes.
type archive struct {
	path, digest string
}

// packCNI runs the real `skeinctl image pack-cni` on reference plugins.
func packCNI(t testing.TB, bin string, plugins ...string) archive {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.tar")
	args := []string{"image", "pack-cni", "-o", out}
	for _, p := range plugins {
		if _, err := os.Stat(filepath.Join(skeintest.RefPluginDir, p)); err != nil {
			t.Skipf("reference plugin %s missing (containernetworking-plugins): %v", p, err)
		}
		args = append(args, "--plugin", filepath.Join(skeintest.RefPluginDir, p))
	}
	if b, err := exec.Command(filepath.Join(bin, "skeinctl"), args...).CombinedOutput(); err != nil {
		t.Fatalf("skeinctl %v: %v\n%s", args, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return archive{path: out, digest: "sha256:" + hex.EncodeToString(sum[:])}
}

// serveHTTP serves the archive on 127.0.0.1 and returns its URL.
func serveHTTP(t testing.TB, a archive) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, a.path)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/plugin.tar"
}

// pushRegistry pushes the archive's image to a real registry and returns
// the docker:// reference pinned by its manifest digest.
func pushRegistry(t testing.TB, host, repo string, a archive) string {
	t.Helper()
	img, err := tarball.ImageFromPath(a.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host+"/"+repo+":latest", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return "docker://" + host + "/" + repo + "@" + d.String()
}

// uplink gives the node an uplink for macvlan: a veth whose other end is
// in a "peer" namespace with addr.
func uplink(t testing.TB, node *harness.NS, addr netip.Prefix) *harness.NS {
	t.Helper()
	peer := harness.NewNS(t, "peer")
	node.AddVeth(t, harness.Veth{Name: "uplink", PeerName: "eth0", Peer: peer})
	peer.AddAddr(t, "eth0", addr)
	return peer
}

// startSkeind writes a config with the pod networks and starts skeind on
// node with it.
func startSkeind(t testing.TB, node *harness.NS, nets []map[string]any) *skeintest.Daemon {
	t.Helper()
	return startSkeindConf(t, node, filepath.Join(t.TempDir(), "skeind.json"), nets)
}

// startSkeindConf is startSkeind with the config file at path (a test
// that rewrites it before a restart).
func startSkeindConf(t testing.TB, node *harness.NS, path string, nets []map[string]any) *skeintest.Daemon {
	t.Helper()
	writeConfig(t, path, nets)
	return skeintest.StartDaemon(t, skeintest.Options{Node: node, Args: []string{"--config", path}})
}

// writeConfig writes skeind's config file with these pod networks.
func writeConfig(t testing.TB, path string, nets []map[string]any) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"podNetworks": nets})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// metaList is the conflist of the meta mode: one skein plugin asking for
// pod networks, with the pod-annotations capability.
func metaList(t testing.TB, d *skeintest.Daemon) *libcni.NetworkConfigList {
	t.Helper()
	return skeintest.ConfList(t, "pods", "1.1.0", d.SkeinPlugin(skeintest.Plugin{
		"podNetworks":  true,
		"capabilities": map[string]bool{"io.kubernetes.cri.pod-annotations": true},
	}))
}

// annotated is a runtime config carrying the skein.dev/networks annotation.
func annotated(id, netnsPath, networks string) *libcni.RuntimeConf {
	rt := skeintest.RT(id, netnsPath, "eth0")
	rt.CapabilityArgs = map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"skein.dev/networks": networks}}
	return rt
}

// pods returns a client of skeind's Pods service in skeind's framed
// protocol (package rpcwire), as skeinctl and Go runtimes call it.
func pods(t testing.TB, d *skeintest.Daemon) rpc.PodsClient {
	conn := rpcwire.Dial(d.Socket)
	t.Cleanup(func() { conn.Close() })
	return rpc.NewPodsClient(conn)
}

// podsGRPC returns a client of skeind's Pods service over gRPC.
func podsGRPC(t testing.TB, d *skeintest.Daemon) rpc.PodsClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rpc.NewPodsClient(conn)
}

// bridgeNet is a pod network of the wrapped reference bridge.
func bridgeNet(name, image, digest, bridge, subnet string) map[string]any {
	n := map[string]any{
		"name": name, "image": image, "cniVersion": "1.0.0", "type": "bridge", "bridge": bridge, "isGateway": true,
		"ipam": map[string]any{"type": "host-local", "subnet": subnet},
	}
	if digest != "" {
		n["digest"] = digest
	}
	return n
}

// macvlanNet is a pod network of the wrapped reference macvlan over the
// node's uplink.
func macvlanNet(name, image, subnet, start string) map[string]any {
	return map[string]any{
		"name": name, "image": image, "cniVersion": "1.0.0", "type": "macvlan", "master": "uplink", "mode": "bridge",
		"ipam": map[string]any{"type": "host-local", "subnet": subnet, "rangeStart": start},
	}
}

// poolNet is the built-in skein network of the default pool.
func poolNet(name string, isDefault bool) map[string]any {
	return map[string]any{"name": name, "type": "skein", "default": isDefault, "containerInterface": "eth0"}
}

func marshal(v any) string {
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(v)
	return b.String()
}

package kurma_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
)

// pluginBin is testdata/plugin built static; pluginImage an OCI layout
// (file://) holding it as /opt/network/add and /opt/network/del.
var pluginBin, pluginImage, mainImage string

func TestMain(m *testing.M) {
	// This test binary doubles as the sandbox init (re-executed).
	sandbox.MaybeRunInit()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "kurma-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pluginBin = filepath.Join(dir, "plugin")
	build := exec.Command("go", "build", "-trimpath", "-o", pluginBin, "./testdata/plugin")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build test plugin: %v\n%s", err, out)
		return 1
	}
	if pluginImage, err = writeImage(filepath.Join(dir, "image"), pluginBin, false); err == nil {
		mainImage, err = writeImage(filepath.Join(dir, "image-main"), pluginBin, true)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "test image: %v\n", err)
		return 1
	}
	return m.Run()
}

// writeImage writes an OCI layout at dir whose one layer holds bin as
// /opt/network/add and /opt/network/del (and, with main, /opt/network/main
// as the image's entry point: its main exec), and returns its file://
// reference.
func writeImage(dir, bin string, main bool) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, d := range []string{"opt/", "opt/network/", "var/", "var/lib/", "var/lib/network/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	files := []string{"opt/network/add", "opt/network/del"}
	if main {
		files = append(files, "opt/network/main")
	}
	for _, f := range files {
		tw.WriteHeader(&tar.Header{Name: f, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))})
		tw.Write(data)
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b.Bytes())), nil })
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err == nil && main {
		img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"/opt/network/main"}})
	}
	if err != nil {
		return "", err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	if err := p.AppendImage(img); err != nil {
		return "", err
	}
	return "file://" + dir, nil
}

func needRoot(t testing.TB) {
	t.Helper()
	harness.RequireRoot(t)
	if pluginImage == "" {
		t.Skip("no test image: TestMain builds it only when run as root, and this test needs root")
	}
}

// world is one test's node: a skeind (in process, real dataplane in its
// own node namespace, real store, sandbox and image cache) and pods.
type world struct {
	t     *testing.T
	node  *harness.NS
	dir   string
	d     *daemon.Daemon
	pods  *kurma.Manager
	log   *harness.SyncBuffer
	cfg   daemon.Config
	state string // <state>/pod-networks
}

// testNets are the networks of most tests; %IMG% is the plugin image.
const testNets = `[
  {"name":"pods","type":"skein","pool":"default","containerInterface":"eth0","default":true},
  {"name":"good","image":"%IMG%","type":"test","mode":"ok","addr":"10.1.0.5/24","containerInterface":"net{{num}}","default":true},
  {"name":"oldstyle","aci":"%IMG%","type":"test","mode":"old","addr":"10.2.0.5/24","containerInterface":"net{{num}}","default":true},
  {"name":"chatty","image":"%IMG%","type":"test","mode":"stderr","addr":"10.3.0.5/24","containerInterface":"c{{shortuuid}}"},
  {"name":"hang","image":"%IMG%","type":"test","mode":"hang","timeout":"3s","containerInterface":"net{{num}}"},
  {"name":"crash","image":"%IMG%","type":"test","mode":"crash","containerInterface":"net{{num}}"},
  {"name":"garbage","image":"%IMG%","type":"test","mode":"garbage","containerInterface":"net{{num}}"},
  {"name":"fail","image":"%IMG%","type":"test","mode":"fail","containerInterface":"net{{num}}"},
  {"name":"maybe","image":"%IMG%","type":"test","mode":"crash","optional":true,"containerInterface":"opt{{random 4}}"},
  {"name":"noimage","image":"file:///nonexistent/kurma-image","type":"test","containerInterface":"net{{num}}"}
]`

func netsJSON(s string) json.RawMessage {
	s = strings.ReplaceAll(s, "%MAINIMG%", mainImage)
	return json.RawMessage(strings.ReplaceAll(s, "%IMG%", pluginImage))
}

func newWorld(t *testing.T, nets string) *world {
	t.Helper()
	needRoot(t)
	w := &world{t: t, node: harness.NewNS(t, "knode"), dir: t.TempDir(), log: &harness.SyncBuffer{}}
	// The networks' state directories are tmpfs mounts that outlive the
	// daemon (see package sandbox); after it stops, before the removal.
	t.Cleanup(func() { harness.UnmountUnder(w.dir) })
	w.state = filepath.Join(w.dir, "state", "pod-networks")
	w.cfg = daemon.Config{
		Node: "test-node", StateDir: filepath.Join(w.dir, "state"), Socket: filepath.Join(w.dir, "sock"),
		MetricsAddr: "off", Dataplane: dataplane.Config{NodeNetNS: w.node.Path()},
		Pools:       []daemon.PoolSpec{{Name: "default", Subnets: []string{"10.77.0.0/16"}}},
		PodNetworks: netsJSON(nets),
		Logger:      slog.New(slog.NewTextHandler(w.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	w.start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", w.log.String())
		}
	})
	return w
}

func (w *world) start() {
	w.t.Helper()
	d, err := daemon.New(context.Background(), w.cfg)
	if err != nil {
		w.t.Fatalf("daemon: %v", err)
	}
	w.d, w.pods = d, d.Pods()
	w.t.Cleanup(func() { d.Close() })
}

// restart closes the daemon and starts a new one on the same state.
func (w *world) restart() {
	w.t.Helper()
	w.d.Close()
	w.start()
}

// pod is a fresh pod namespace.
func (w *world) pod() *harness.NS { return harness.NewNS(w.t, "kpod") }

// links lists a namespace's interfaces other than lo.
func links(t testing.TB, ns *harness.NS) []string {
	t.Helper()
	ls, err := ns.Handle(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		if n := l.Attrs().Name; n != "lo" {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// calls returns the plugin calls logged by every network, in time order:
// "add good net1" ...
func (w *world) calls(uuid string) []string {
	w.t.Helper()
	type call struct {
		at   string
		what string
	}
	var all []call
	logs, _ := filepath.Glob(filepath.Join(w.state, "*", "log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line) // time op network uuid [ifname]
			if len(f) < 4 || f[3] != uuid {
				continue
			}
			ifname := ""
			if len(f) > 4 {
				ifname = f[4]
			}
			all = append(all, call{at: fmt.Sprintf("%020s", f[0]), what: f[1] + " " + f[2] + " " + ifname})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at < all[j].at })
	var out []string
	for _, c := range all {
		out = append(out, c.what)
	}
	return out
}

// assertNothingLeft: no record of the pod, no interface in its namespace,
// no skein attachment (so no address held).
func (w *world) assertNothingLeft(id string, ns *harness.NS) {
	w.t.Helper()
	if _, err := w.pods.Status(context.Background(), id); !errors.Is(err, kurma.ErrUnknownPod) {
		w.t.Errorf("pod %s: status error %v, want no record", id, err)
	}
	for _, k := range volatileKeys(w.t, w) {
		if pod, _, _ := strings.Cut(k, "/"); pod == id {
			w.t.Errorf("pod %s: a completion of its record is left under %s", id, k)
		}
	}
	if ns != nil {
		if l := links(w.t, ns); len(l) > 0 {
			w.t.Errorf("pod %s: interfaces %v left in its namespace", id, l)
		}
	}
	atts, err := w.d.Store().ListAttachments(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	for _, a := range atts {
		if a.ContainerID == id {
			w.t.Errorf("pod %s: skein attachment %s left, holding %v", id, a.AttachmentKey, a.Addrs)
		}
	}
}

// volatileKeys are the keys of the pod records' completions in the
// daemon's volatile file (none when its store has no volatile tier).
func volatileKeys(t testing.TB, w *world) []string {
	t.Helper()
	v, ok := w.d.Store().(interface{ Volatile() store.Store })
	if !ok {
		return nil // every record is in the synced file
	}
	all, err := v.Volatile().ListMeta(context.Background(), kurma.MetaKind)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Sorted(maps.Keys(all))
}

func sel(specs ...string) []kurma.Selection {
	var out []kurma.Selection
	for _, s := range specs {
		n, ifname, _ := strings.Cut(s, "@")
		out = append(out, kurma.Selection{Network: n, IfName: ifname})
	}
	return out
}

func names(as []kurma.AttachmentRecord) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Network+"@"+a.IfName)
	}
	return out
}

func equal(a, b []string) bool { return slices.Equal(a, b) }

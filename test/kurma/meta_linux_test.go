package kurma

import (
	"encoding/json"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	types020 "github.com/containernetworking/cni/pkg/types/020"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestMetaVersions: the meta mode answers in the conflist's CNI version,
// old ones included (0.2.0 has room for one address per family: the first
// network's), and every version's DEL detaches the pod.
func TestMetaVersions(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	d := startSkeind(t, node, []map[string]any{
		poolNet("pool", true),
		bridgeNet("blue", "file://"+img.path, "", "kbr-v", "10.77.0.0/24"),
	})
	cni := d.CNI()
	for _, v := range []string{"1.1.0", "1.0.0", "0.4.0", "0.3.1", "0.2.0"} {
		t.Run(v, func(t *testing.T) {
			pod := harness.NewNS(t, "pod")
			list := skeintest.ConfList(t, "pods", v, d.SkeinPlugin(skeintest.Plugin{"podNetworks": true}))
			rt := skeintest.RT("ver-"+v[:1]+v[2:3]+v[4:], pod.Path(), "eth0")
			rt.Args = [][2]string{{"SKEIN_NETWORKS", "pool,blue@net1"}}
			res, err := cni.AddNetworkList(ctx(t), list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Errorf("result version %s, want %s", res.Version(), v)
			}
			if v == "0.2.0" {
				r, err := types020.GetResult(res)
				if err != nil || r.IP4 == nil || !netip.MustParsePrefix("10.64.0.0/16").Contains(netip.MustParseAddr(r.IP4.IP.IP.String())) {
					t.Errorf("0.2.0 result %+v %v: want the pool's address as ip4", r, err)
				}
			} else {
				a := ifaces(t, res)
				if !netip.MustParsePrefix("10.77.0.0/24").Contains(v4(a["net1"])) || !v4(a["eth0"]).IsValid() {
					t.Errorf("result %v", a)
				}
			}
			if _, err := pod.Handle(t).LinkByName("net1"); err != nil {
				t.Errorf("net1: %v", err)
			}
			if err := cni.DelNetworkList(ctx(t), list, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if links, _ := pod.Handle(t).LinkList(); len(links) != 1 {
				t.Errorf("%d links left", len(links))
			}
		})
	}
}

// TestMetaRestart: skeind is killed (SIGKILL) between a meta ADD and its
// DEL, and the network leaves its config meanwhile; after the restart the
// pod keeps its networks (the add's outcome, written unsynced, survived
// the kill), the DEL still removes everything (from the records), and a
// second DEL succeeds.
func TestMetaRestart(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	conf := filepath.Join(t.TempDir(), "skeind.json")
	d := startSkeindConf(t, node, conf, []map[string]any{
		poolNet("pool", true),
		bridgeNet("blue", "file://"+img.path, "", "kbr-r", "10.77.0.0/24"),
	})
	pod := harness.NewNS(t, "pod")
	list := metaList(t, d)
	rt := annotated("restart-1", pod.Path(), "pool,blue@net1")
	if _, err := d.CNI().AddNetworkList(ctx(t), list, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	wantLinks(t, pod, "eth0", "lo", "net1")
	d.Kill(t)
	// The new config has no pod network named blue any more.
	writeConfig(t, conf, []map[string]any{poolNet("pool", true)})
	d.Start(t)
	// The add's outcome, written unsynced, survived the kill: nothing was
	// rolled back at start.
	wantLinks(t, pod, "eth0", "lo", "net1")
	if l, err := pods(t, d).List(ctx(t), &rpc.Empty{}); err != nil || len(l.Pods) == 0 {
		t.Fatalf("records after the restart: %v %v", l, err)
	} else {
		for _, p := range l.Pods {
			for _, a := range p.Attachments {
				if a.State != "attached" {
					t.Errorf("after the restart pod %s network %s is %q", p.Id, a.Network, a.State)
				}
			}
		}
	}
	for i := range 2 {
		if err := d.CNI().DelNetworkList(ctx(t), list, rt); err != nil {
			t.Fatalf("DEL #%d after restart: %v\n%s", i+1, err, d.Log())
		}
	}
	if links, _ := pod.Handle(t).LinkList(); len(links) != 1 {
		t.Errorf("%d links left in the pod", len(links))
	}
	if l, err := pods(t, d).List(ctx(t), &rpc.Empty{}); err != nil || len(l.Pods) != 0 {
		t.Errorf("records: %v %v", l, err)
	}
	assertFreed(t, d, node, "restart-1", "kbr-r")
}

// assertFreed: nothing of pod id is left: no record, no skein attachment
// (pool address), no host-local lease of a wrapped network (the lease
// files hold the container ID), no veth on bridge in the node.
func assertFreed(t *testing.T, d *skeintest.Daemon, node *harness.NS, id, bridge string) {
	t.Helper()
	l, err := pods(t, d).List(ctx(t), &rpc.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Pods {
		if p.Id == id {
			t.Errorf("pod %s still recorded: %v", id, p)
		}
	}
	for _, a := range d.Attachments(t) {
		if a.ContainerId == id {
			t.Errorf("skein attachment %s/%s of pod %s left, holding %v", a.Network, a.Ifname, id, a.Addresses)
		}
	}
	if out, err := node.Exec(t, "ip", "-o", "link", "show", "master", bridge); err == nil && strings.TrimSpace(out) != "" {
		t.Errorf("links left on %s: %s", bridge, out)
	}
	_ = filepath.WalkDir(filepath.Join(d.Dir, "state", "pod-networks"), func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || strings.Contains(p, "skein-netplugin") {
			return nil
		}
		if b, _ := os.ReadFile(p); strings.HasPrefix(string(b), id) {
			t.Errorf("host-local lease %s of pod %s left", p, id)
		}
		return nil
	})
}

// TestMetaDelNoRecord: the record of a meta-mode pod is lost (deleted
// from the store while skeind was stopped); DEL still frees its pool
// address (the attachment skeind's pool made for it) and, from the
// current config, the wrapped bridge's lease and veth.
func TestMetaDelNoRecord(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	d := startSkeind(t, node, []map[string]any{
		poolNet("pool", true),
		bridgeNet("blue", "file://"+img.path, "", "kbr-l", "10.77.0.0/24"),
	})
	pod := harness.NewNS(t, "pod")
	list := metaList(t, d)
	rt := annotated("lost-1", pod.Path(), "pool,blue@net1")
	if _, err := d.CNI().AddNetworkList(ctx(t), list, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	d.Stop(t)
	st, err := store.OpenBolt(filepath.Join(d.Dir, "state", "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Every record of the container, whatever its key.
	all, err := st.ListMeta(ctx(t), "kurma-pods")
	for key, b := range all {
		var r struct{ ID string }
		if err == nil && json.Unmarshal(b, &r) == nil && r.ID == "lost-1" {
			err = st.PutMeta(ctx(t), "kurma-pods", key, nil)
		}
	}
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	d.Start(t)
	if l, err := pods(t, d).List(ctx(t), &rpc.Empty{}); err != nil || len(l.Pods) != 0 {
		t.Fatalf("records after deleting it: %v %v", l, err)
	}
	if err := d.CNI().DelNetworkList(ctx(t), list, rt); err != nil {
		t.Fatalf("DEL without a record: %v\n%s", err, d.Log())
	}
	assertFreed(t, d, node, "lost-1", "kbr-l")
	if links, _ := pod.Handle(t).LinkList(); len(links) != 1 {
		t.Errorf("%d links left in the pod", len(links))
	}
}

// TestMetaDelNetNSGone: the pod's namespace is removed before its DEL (CNI:
// DEL must succeed then); the wrapped bridge's del still runs, without the
// namespace, and frees its lease and veth; the pool's address is freed.
func TestMetaDelNetNSGone(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	d := startSkeind(t, node, []map[string]any{
		poolNet("pool", true),
		bridgeNet("blue", "file://"+img.path, "", "kbr-g", "10.77.0.0/24"),
	})
	pod := harness.NewNS(t, "pod")
	list := metaList(t, d)
	rt := annotated("gone-1", pod.Path(), "pool,blue@net1")
	if _, err := d.CNI().AddNetworkList(ctx(t), list, rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if err := netns.Remove(pod.Path()); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := d.CNI().DelNetworkList(ctx(t), list, rt); err != nil {
			t.Fatalf("DEL #%d with the netns gone: %v\n%s", i+1, err, d.Log())
		}
	}
	assertFreed(t, d, node, "gone-1", "kbr-g")
}

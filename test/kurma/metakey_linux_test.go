package kurma

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// The tests of this file are about what a meta-mode record is: one per CNI
// attachment, (container, CNI network name, CNI_IFNAME), as the runtime
// sees them. Two attachments of one container must neither merge nor
// remove each other's interfaces.

// metaListNamed is metaList under another CNI network name.
func metaListNamed(t testing.TB, d *skeintest.Daemon, name string) *libcni.NetworkConfigList {
	t.Helper()
	return skeintest.ConfList(t, name, "1.1.0", d.SkeinPlugin(skeintest.Plugin{
		"podNetworks":  true,
		"capabilities": map[string]bool{"io.kubernetes.cri.pod-annotations": true},
	}))
}

// annotatedIf is annotated with CNI_IFNAME ifname.
func annotatedIf(id, netnsPath, ifname, networks string) *libcni.RuntimeConf {
	rt := annotated(id, netnsPath, networks)
	rt.IfName = ifname
	return rt
}

// wantLinks fails unless the pod's interfaces are exactly names.
func wantLinks(t *testing.T, pod *harness.NS, names ...string) {
	t.Helper()
	links, err := pod.Handle(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range links {
		got = append(got, l.Attrs().Name)
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("pod %s has interfaces %v, want %v", pod.Name(), got, names)
	}
}

// recordedIfs lists, per record of pod id, its attachments as
// network/ifname, sorted.
func recordedIfs(t *testing.T, d *skeintest.Daemon, id string) []string {
	t.Helper()
	l, err := pods(t, d).List(ctx(t), &rpc.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range l.Pods {
		if p.Id != id {
			continue
		}
		var atts []string
		for _, a := range p.Attachments {
			atts = append(atts, a.Network+"/"+a.Ifname)
		}
		out = append(out, strings.Join(atts, ","))
	}
	slices.Sort(out)
	return out
}

// leases lists the interfaces of pod id that hold a host-local lease of a
// wrapped network (a lease file holds "<container>\r\n<ifname>").
func leases(t *testing.T, d *skeintest.Daemon, id string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(filepath.Join(d.Dir, "state", "pod-networks"), func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || strings.Contains(p, "skein-netplugin") {
			return nil
		}
		b, _ := os.ReadFile(p)
		if owner, ifname, ok := strings.Cut(string(b), "\r\n"); ok && owner == id {
			out = append(out, strings.TrimSpace(ifname))
		}
		return nil
	})
	slices.Sort(out)
	return out
}

// poolIfs lists the interfaces of pod id that hold an address of a skein
// pool.
func poolIfs(t *testing.T, d *skeintest.Daemon, id string) []string {
	t.Helper()
	var out []string
	for _, a := range d.Attachments(t) {
		if a.ContainerId == id {
			out = append(out, a.Ifname)
		}
	}
	slices.Sort(out)
	return out
}

// gcFresh sends a CNI GC with these valid attachments from a runtime
// with an empty result cache, so that libcni DELs nothing itself: the
// choice is skeind's alone.
func gcFresh(t *testing.T, d *skeintest.Daemon, list *libcni.NetworkConfigList, valid ...types.GCAttachment) {
	t.Helper()
	rt := skeintest.NewCNI([]string{d.BinDir, skeintest.RefPluginDir}, t.TempDir())
	args := &libcni.GCArgs{ValidAttachments: append([]types.GCAttachment{}, valid...)}
	if err := rt.GCNetworkList(ctx(t), list, args); err != nil {
		t.Fatalf("GC of %s with valid %v: %v\n%s", list.Name, valid, err, d.Log())
	}
}

// TestMetaTwoConflists: one container is attached through two conflists
// (CNI networks pods-a on eth0 and pods-b on net1). Each keeps its own
// record; an ADD naming an unknown network fails clearly and changes
// nothing; DEL of pods-a (twice) removes only its interface and lease, and
// pods-b's interface, pool address and record stay and its CHECK passes.
func TestMetaTwoConflists(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	d := startSkeind(t, node, []map[string]any{
		poolNet("pool", false),
		bridgeNet("blue", "file://"+img.path, "", "kbr-2c", "10.77.0.0/24"),
	})
	cni := d.CNI()
	pod := harness.NewNS(t, "pod")
	const id = "two-conf-1"
	listA, listB := metaListNamed(t, d, "pods-a"), metaListNamed(t, d, "pods-b")
	rtA := annotatedIf(id, pod.Path(), "eth0", "blue")
	rtB := annotatedIf(id, pod.Path(), "net1", "pool")
	if _, err := cni.AddNetworkList(ctx(t), listA, rtA); err != nil {
		t.Fatalf("ADD pods-a: %v", err)
	}
	if _, err := cni.AddNetworkList(ctx(t), listB, rtB); err != nil {
		t.Fatalf("ADD pods-b: %v", err)
	}
	wantLinks(t, pod, "lo", "eth0", "net1")
	if got, want := recordedIfs(t, d, id), []string{"blue/eth0", "pool/net1"}; !slices.Equal(got, want) {
		t.Errorf("records of %s: %v, want one per conflist %v", id, got, want)
	}

	// Bad input: a third attachment naming an unknown network.
	snap := harness.Snapshot(t, pod)
	_, err := cni.AddNetworkList(ctx(t), listB, annotatedIf(id, pod.Path(), "net2", "nosuch"))
	if skeintest.ErrCode(err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("ADD naming network nosuch: got %v, want code %d naming it", err, types.ErrInvalidNetworkConfig)
	}
	harness.AssertSame(t, snap, harness.Snapshot(t, pod))
	if got, want := recordedIfs(t, d, id), []string{"blue/eth0", "pool/net1"}; !slices.Equal(got, want) {
		t.Errorf("records after the failed ADD: %v, want %v", got, want)
	}

	// DEL of pods-a, twice (the second finds no record).
	for i := range 2 {
		if err := cni.DelNetworkList(ctx(t), listA, rtA); err != nil {
			t.Fatalf("DEL #%d of pods-a: %v\n%s", i+1, err, d.Log())
		}
	}
	wantLinks(t, pod, "lo", "net1")
	if got, want := recordedIfs(t, d, id), []string{"pool/net1"}; !slices.Equal(got, want) {
		t.Errorf("records after DEL of pods-a: %v, want %v", got, want)
	}
	if got := poolIfs(t, d, id); !slices.Equal(got, []string{"net1"}) {
		t.Errorf("pool addresses after DEL of pods-a held for %v, want [net1]", got)
	}
	if got := leases(t, d, id); len(got) != 0 {
		t.Errorf("host-local leases after DEL of pods-a: %v, want none", got)
	}
	if err := cni.CheckNetworkList(ctx(t), listB, rtB); err != nil {
		t.Errorf("CHECK of pods-b after DEL of pods-a: %v", err)
	}

	if err := cni.DelNetworkList(ctx(t), listB, rtB); err != nil {
		t.Fatalf("DEL of pods-b: %v", err)
	}
	wantLinks(t, pod, "lo")
	assertFreed(t, d, node, id, "kbr-2c")
}

// TestMetaOneConflistTwoIfnames: one conflist attaches a container twice,
// on eth0 and on eth1, both to the wrapped bridge: two records, two
// leases. DEL of eth0 leaves eth1, its lease and its record; CHECK of
// eth1 passes.
func TestMetaOneConflistTwoIfnames(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	d := startSkeind(t, node, []map[string]any{
		bridgeNet("blue", "file://"+img.path, "", "kbr-2i", "10.77.0.0/24"),
	})
	cni := d.CNI()
	pod := harness.NewNS(t, "pod")
	const id = "two-if-1"
	list := metaList(t, d)
	rt0 := annotatedIf(id, pod.Path(), "eth0", "blue")
	rt1 := annotatedIf(id, pod.Path(), "eth1", "blue")
	for _, rt := range []*libcni.RuntimeConf{rt0, rt1} {
		if _, err := cni.AddNetworkList(ctx(t), list, rt); err != nil {
			t.Fatalf("ADD %s: %v", rt.IfName, err)
		}
	}
	wantLinks(t, pod, "lo", "eth0", "eth1")
	if got, want := leases(t, d, id), []string{"eth0", "eth1"}; !slices.Equal(got, want) {
		t.Errorf("leases %v, want %v", got, want)
	}

	if err := cni.DelNetworkList(ctx(t), list, rt0); err != nil {
		t.Fatalf("DEL eth0: %v\n%s", err, d.Log())
	}
	wantLinks(t, pod, "lo", "eth1")
	if got, want := leases(t, d, id), []string{"eth1"}; !slices.Equal(got, want) {
		t.Errorf("leases after DEL of eth0: %v, want %v", got, want)
	}
	if got, want := recordedIfs(t, d, id), []string{"blue/eth1"}; !slices.Equal(got, want) {
		t.Errorf("records after DEL of eth0: %v, want %v", got, want)
	}
	if err := cni.CheckNetworkList(ctx(t), list, rt1); err != nil {
		t.Errorf("CHECK of eth1 after DEL of eth0: %v", err)
	}

	if err := cni.DelNetworkList(ctx(t), list, rt1); err != nil {
		t.Fatalf("DEL eth1: %v", err)
	}
	wantLinks(t, pod, "lo")
	assertFreed(t, d, node, id, "kbr-2i")
}

// TestMetaGCByIfname: a CNI GC whose valid attachments list the
// container on eth1 only removes its eth0 attachment (interface, lease,
// record) and keeps eth1's (interface, pool address, record; CHECK
// passes).
func TestMetaGCByIfname(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	d := startSkeind(t, node, []map[string]any{
		poolNet("pool", false),
		bridgeNet("blue", "file://"+img.path, "", "kbr-gi", "10.77.0.0/24"),
	})
	cni := d.CNI()
	pod := harness.NewNS(t, "pod")
	const id = "gc-if-1"
	list := metaList(t, d)
	rt0 := annotatedIf(id, pod.Path(), "eth0", "blue")
	rt1 := annotatedIf(id, pod.Path(), "eth1", "pool")
	for _, rt := range []*libcni.RuntimeConf{rt0, rt1} {
		if _, err := cni.AddNetworkList(ctx(t), list, rt); err != nil {
			t.Fatalf("ADD %s: %v", rt.IfName, err)
		}
	}

	gcFresh(t, d, list, types.GCAttachment{ContainerID: id, IfName: "eth1"})
	wantLinks(t, pod, "lo", "eth1")
	if got := leases(t, d, id); len(got) != 0 {
		t.Errorf("leases after GC: %v, want none (eth0 was not valid)", got)
	}
	if got, want := recordedIfs(t, d, id), []string{"pool/eth1"}; !slices.Equal(got, want) {
		t.Errorf("records after GC: %v, want %v", got, want)
	}
	if got := poolIfs(t, d, id); !slices.Equal(got, []string{"eth1"}) {
		t.Errorf("pool addresses after GC held for %v, want [eth1]", got)
	}
	if err := cni.CheckNetworkList(ctx(t), list, rt1); err != nil {
		t.Errorf("CHECK of eth1 after GC: %v", err)
	}

	if err := cni.DelNetworkList(ctx(t), list, rt1); err != nil {
		t.Fatalf("DEL eth1: %v", err)
	}
	assertFreed(t, d, node, id, "kbr-gi")
}

// TestMetaOldRecord: records written before they were keyed per
// attachment (one per container, under its ID, with no "key") are still
// served after an upgrade. Pods old-1 and old-2 are attached to the
// wrapped bridge on eth0 and their records rewritten in the old format
// while skeind is stopped; after the restart old-1 also gets a pool
// interface on eth1 through the same conflist (a record of the new
// format). CHECK of both of old-1's attachments passes; a GC listing only
// old-1 removes old-2 and nothing of old-1; DEL of old-1's eth0 (twice)
// removes the old record's interface and lease but not eth1's, whose
// CHECK still passes; DEL of eth1 frees the rest.
func TestMetaOldRecord(t *testing.T) {
	harness.RequireRoot(t)
	bin := skeintest.Binaries(t)
	img := packCNI(t, bin, "bridge", "host-local")
	node := harness.NewNS(t, "node")
	d := startSkeind(t, node, []map[string]any{
		poolNet("pool", false),
		bridgeNet("blue", "file://"+img.path, "", "kbr-o", "10.77.0.0/24"),
	})
	cni := d.CNI()
	list := metaList(t, d)
	podC, podD := harness.NewNS(t, "pod"), harness.NewNS(t, "pod")
	rtC0 := annotatedIf("old-1", podC.Path(), "eth0", "blue")
	rtD0 := annotatedIf("old-2", podD.Path(), "eth0", "blue")
	for _, rt := range []*libcni.RuntimeConf{rtC0, rtD0} {
		if _, err := cni.AddNetworkList(ctx(t), list, rt); err != nil {
			t.Fatalf("ADD %s: %v", rt.ContainerID, err)
		}
	}
	d.Stop(t)
	rewriteOld(t, d, "old-1", "old-2")
	d.Start(t)

	rtC1 := annotatedIf("old-1", podC.Path(), "eth1", "pool")
	if _, err := cni.AddNetworkList(ctx(t), list, rtC1); err != nil {
		t.Fatalf("ADD old-1 eth1 after the upgrade: %v", err)
	}
	for _, rt := range []*libcni.RuntimeConf{rtC0, rtC1, rtD0} {
		if err := cni.CheckNetworkList(ctx(t), list, rt); err != nil {
			t.Errorf("CHECK %s %s: %v", rt.ContainerID, rt.IfName, err)
		}
	}

	gcFresh(t, d, list, types.GCAttachment{ContainerID: "old-1", IfName: "eth0"}, types.GCAttachment{ContainerID: "old-1", IfName: "eth1"})
	wantLinks(t, podD, "lo")
	if got := recordedIfs(t, d, "old-2"); len(got) != 0 {
		t.Errorf("records of old-2 after GC: %v, want none", got)
	}
	if got := leases(t, d, "old-2"); len(got) != 0 {
		t.Errorf("leases of old-2 after GC: %v, want none", got)
	}
	wantLinks(t, podC, "lo", "eth0", "eth1")
	if got, want := recordedIfs(t, d, "old-1"), []string{"blue/eth0", "pool/eth1"}; !slices.Equal(got, want) {
		t.Errorf("records of old-1 after GC: %v, want %v", got, want)
	}

	for i := range 2 {
		if err := cni.DelNetworkList(ctx(t), list, rtC0); err != nil {
			t.Fatalf("DEL #%d of old-1 eth0: %v\n%s", i+1, err, d.Log())
		}
	}
	wantLinks(t, podC, "lo", "eth1")
	if got := leases(t, d, "old-1"); len(got) != 0 {
		t.Errorf("leases of old-1 after DEL of eth0: %v, want none", got)
	}
	if got, want := recordedIfs(t, d, "old-1"), []string{"pool/eth1"}; !slices.Equal(got, want) {
		t.Errorf("records of old-1 after DEL of eth0: %v, want %v", got, want)
	}
	if got := poolIfs(t, d, "old-1"); !slices.Equal(got, []string{"eth1"}) {
		t.Errorf("pool addresses of old-1 after DEL of eth0 held for %v, want [eth1]", got)
	}
	if err := cni.CheckNetworkList(ctx(t), list, rtC1); err != nil {
		t.Errorf("CHECK of old-1 eth1 after DEL of eth0: %v", err)
	}

	if err := cni.DelNetworkList(ctx(t), list, rtC1); err != nil {
		t.Fatalf("DEL of old-1 eth1: %v", err)
	}
	wantLinks(t, podC, "lo")
	assertFreed(t, d, node, "old-1", "kbr-o")
}

// rewriteOld rewrites the pod records of these containers as skeind wrote
// them before records were keyed per attachment: under the container ID,
// without "key", whole in the synced file (the outcome merged in, without
// seals). skeind must be stopped.
func rewriteOld(t *testing.T, d *skeintest.Daemon, ids ...string) {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(d.Dir, "state", "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	vol, err := store.OpenBolt(d.VolatileStore(), store.BoltOptions{AttachmentsOnly: true, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	all, err := st.ListMeta(ctx(t), "kurma-pods")
	if err != nil {
		t.Fatal(err)
	}
	done, err := vol.ListMeta(ctx(t), "kurma-pods")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for key, b := range all {
		var r map[string]any
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("record %s: %v", key, err)
		}
		id, _ := r["id"].(string)
		if !slices.Contains(ids, id) {
			continue
		}
		if found[id] {
			t.Fatalf("two records of %s before the rewrite", id)
		}
		found[id] = true
		var c map[string]any
		if cb, ok := done[key]; ok {
			if err := json.Unmarshal(cb, &c); err != nil {
				t.Fatalf("completion of %s: %v", key, err)
			}
			if c["over"] != r["seal"] {
				t.Fatalf("completion of %s over %v, the record's seal is %v", key, c["over"], r["seal"])
			}
			r = c
		}
		delete(r, "key")
		delete(r, "seal")
		delete(r, "over")
		old, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(st.PutMeta(ctx(t), "kurma-pods", key, nil), vol.PutMeta(ctx(t), "kurma-pods", key, nil)); err != nil {
			t.Fatal(err)
		}
		if err := st.PutMeta(ctx(t), "kurma-pods", id, old); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		if !found[id] {
			t.Fatalf("no record of %s to rewrite", id)
		}
	}
}

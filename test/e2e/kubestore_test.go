package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// kubeNode is a real skeind with --store kubernetes serving one node
// namespace, its metrics on a loopback port.
type kubeNode struct {
	*env
	name    string
	metrics string
}

func startKubeNode(t *testing.T, kubeconfig, name string, extra ...string) *kubeNode {
	t.Helper()
	n := kubenode.StartNode(t, kubeconfig, name, kubenode.NodeOptions{Args: extra})
	return &kubeNode{env: &env{d: n.D, cni: n.D.CNI(), base: nodeState(t, n.D)}, name: name, metrics: n.Metrics}
}

// apiWrites reads skein_api_requests_total from skeind's metrics and
// returns the requests that were not reads.
func (n *kubeNode) apiWrites(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(n.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "skein_api_requests_total{") || strings.Contains(line, `method="GET"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		total += int(v)
	}
	return total
}

func podIn(n *kubeNode, t *testing.T, l *libcni.NetworkConfigList, namespace, id string) *pod {
	t.Helper()
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT(id, ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", id}}
	r, err := n.add(t, l, rt)
	if err != nil {
		t.Fatalf("ADD %s (namespace %s) on %s: %v", id, namespace, n.name, err)
	}
	res := asCurrent(t, r)
	return &pod{ns: ns, rt: rt, res: res, addrs: ctrAddrs(res, rt.IfName, ns.Path())}
}

// blockOf returns the AddressBlock holding addr, from the API server.
func blockOf(t *testing.T, c client.Client, addr netip.Addr) *skeinv1.AddressBlock {
	t.Helper()
	var l skeinv1.AddressBlockList
	if err := c.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	for i, b := range l.Items {
		if b.IPv4 != nil && netip.MustParsePrefix(*b.IPv4).Contains(addr) {
			return &l.Items[i]
		}
	}
	return nil
}

// TestKubeStore runs real skeind binaries with --store kubernetes against a
// real API server and no controller at all: each node claims its blocks
// itself (one create of the AddressBlock <pool>-<index> naming it), a
// namespace's annotation picks the pool, ADDs and DELs that fit in an
// owned block make no API write, a claim is one, a block of a pool no pod
// uses any more goes back after --block-min-age (not before), a restart
// keeps the blocks in use and gives back one the node holds but does not
// use, and a namespace naming a pool that does not exist fails clearly
// with nothing left behind.
func TestKubeStore(t *testing.T) {
	harness.RequireRoot(t)
	kenv := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(kenv.Config)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	pools := map[string]*skeinv1.AddressPool{}
	for _, p := range []struct{ name, v4 string }{{"default", "10.90.0.0/24"}, {"blue", "10.91.0.0/24"}} {
		pools[p.name] = &skeinv1.AddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec:       skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(p.v4)}}, BlockSizeBits: 3},
		}
		if err := c.Create(bg, pools[p.name]); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "skein-system"}}, // the nodes' Leases
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-blue", Annotations: map[string]string{skeinv1.AnnotationPool: "blue"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-none", Annotations: map[string]string{skeinv1.AnnotationPool: "no-such-pool"}}},
	} {
		if err := c.Create(bg, ns); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := kenv.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	// A Lease of an hour is renewed every quarter of an hour: no renewal
	// falls among the writes counted below.
	const minAge = 3 * time.Second
	args := []string{"--lease-duration", "1h", "--block-min-age", minAge.String()}
	a := startKubeNode(t, kc, "kn-a", args...)
	b := startKubeNode(t, kc, "kn-b", args...)
	l := skeintest.ConfList(t, "kube", "1.1.0", a.d.SkeinPlugin(nil))
	lb := skeintest.ConfList(t, "kube", "1.1.0", b.d.SkeinPlugin(nil))

	// One pod on each node, each in a block its node claimed: named
	// <pool>-<index>, owned (nodeName and label) by the node, of pool
	// default, its owner the pool. No controller runs: nobody else
	// could have made them.
	pa := podIn(a, t, l, "plain", "pa")
	pb := podIn(b, t, lb, "plain", "pb")
	ba, bb := blockOf(t, c, pa.addrs[0]), blockOf(t, c, pb.addrs[0])
	if ba == nil || bb == nil || ba.Name == bb.Name {
		t.Fatalf("pods' blocks %v and %v: want two distinct blocks", ba, bb)
	}
	for n, blk := range map[string]*skeinv1.AddressBlock{"kn-a": ba, "kn-b": bb} {
		if blk.NodeName != n || blk.Labels[skeinv1.LabelNode] != n || blk.Labels[skeinv1.LabelPool] != "default" ||
			blk.Name != skeinv1.BlockName("default", uint32(blk.Index)) || len(blk.OwnerReferences) != 1 ||
			blk.OwnerReferences[0].UID != pools["default"].UID {
			t.Errorf("block %s of %s's pod: nodeName %q, labels %v, owners %v: want node %s's claim of a block of pool default (name default-<index>, owner the pool %s)",
				blk.Name, n, blk.NodeName, blk.Labels, blk.OwnerReferences, n, pools["default"].UID)
		}
	}

	// More pods on kn-a fit in its block: no API write at all.
	before := a.apiWrites(t)
	if before == 0 {
		t.Fatal("skein_api_requests_total counts no write although a block was claimed")
	}
	var more []*pod
	for i := range 3 {
		p := podIn(a, t, l, "plain", fmt.Sprintf("pa%d", i))
		if blk := blockOf(t, c, p.addrs[0]); blk == nil || blk.Name != ba.Name {
			t.Fatalf("pod %s got %v outside kn-a's block %s", p.rt.ContainerID, p.addrs, ba.Name)
		}
		more = append(more, p)
	}
	if after := a.apiWrites(t); after != before {
		t.Errorf("3 ADDs that fit in an owned block made %d API writes, want 0", after-before)
	}
	for _, p := range more {
		a.mustDel(t, l, p.rt)
	}
	if after := a.apiWrites(t); after != before {
		t.Errorf("3 DELs that left the block in use made %d API writes, want 0", after-before)
	}

	// The namespace's annotation picks the pool: kn-a claims a block of
	// blue with one write. Once its pod goes, the block stays for
	// --block-min-age, then goes back.
	before = a.apiWrites(t)
	blue := podIn(a, t, l, "team-blue", "blue")
	bblk := blockOf(t, c, blue.addrs[0])
	if bblk == nil || bblk.Labels[skeinv1.LabelPool] != "blue" || bblk.NodeName != "kn-a" {
		t.Fatalf("pod in namespace team-blue got %v in block %v: want kn-a's block of pool blue", blue.addrs, bblk)
	}
	if w := a.apiWrites(t) - before; w != 1 {
		t.Errorf("the ADD that claimed block %s made %d API writes, want 1 (the create)", bblk.Name, w)
	}
	a.mustDel(t, l, blue.rt)
	emptied := time.Now()
	if blk := blockOf(t, c, blue.addrs[0]); blk == nil && time.Since(emptied) < minAge {
		t.Errorf("block %s was given back at once, not after --block-min-age %v", bblk.Name, minAge)
	}
	eventually(t, "kn-a's empty block of pool blue given back", func() string {
		if blk := blockOf(t, c, blue.addrs[0]); blk != nil {
			return fmt.Sprintf("block %s still there %v after its last address was freed", blk.Name, time.Since(emptied).Round(time.Second))
		}
		return ""
	})

	// A crash and restart keeps the block pa uses and gives back a block
	// of kn-a's that nothing uses (as a claim whose answer was lost
	// leaves, the node dying before it learnt of it).
	a.d.Kill(t)
	stray := strayBlock(t, c, pools["default"], "kn-a")
	a.d.Start(t)
	if blk := blockOf(t, c, pa.addrs[0]); blk == nil || blk.UID != ba.UID {
		t.Errorf("after restart pa's block is %v, want %s kept", blk, ba.Name)
	}
	eventually(t, "the unused block given back after the restart", func() string {
		err := c.Get(bg, client.ObjectKey{Name: stray}, &skeinv1.AddressBlock{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("block %s: %v", stray, err)
		}
		return ""
	})
	if err := a.check(t, l, pa.rt); err != nil {
		t.Errorf("CHECK pa after restart: %v", err)
	}

	// A namespace naming a pool that does not exist: the ADD fails
	// saying so, leaving no link, attachment or block.
	linksBefore, attsBefore := hostLinks(t, b.d.Node), len(b.d.Attachments(t))
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT("nopool", ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", "team-none"}, {"K8S_POD_NAME", "nopool"}}
	_, err = b.add(t, lb, rt)
	wantCode(t, "ADD in namespace team-none, whose pool does not exist", err, types.ErrInvalidNetworkConfig)
	if err != nil && !strings.Contains(err.Error(), "no-such-pool") {
		t.Errorf("ADD in namespace team-none: %v; want an error naming pool no-such-pool", err)
	}
	if got := hostLinks(t, b.d.Node); strings.Join(got, ",") != strings.Join(linksBefore, ",") {
		t.Errorf("the failed ADD left links: %v, before %v", got, linksBefore)
	}
	if got := len(b.d.Attachments(t)); got != attsBefore {
		t.Errorf("the failed ADD left an attachment: %d, before %d", got, attsBefore)
	}
	if err := b.del(t, lb, rt); err != nil {
		t.Errorf("DEL after the failed ADD: %v", err)
	}

	// Every pod gone: each node keeps its spare block of the default pool
	// (its first pod's), nothing else; no BlockRequest was ever made.
	b.mustDel(t, lb, pb.rt)
	b.assertNothingLeft(t)
	a.mustDel(t, l, pa.rt)
	a.assertNothingLeft(t)
	eventually(t, "the blocks left to be the nodes' spares", func() string {
		var have []string
		for _, blk := range listBlocks(t, c) {
			have = append(have, blk.Name+"/"+blk.NodeName)
		}
		slices.Sort(have)
		if want := []string{ba.Name + "/kn-a", bb.Name + "/kn-b"}; !slices.Equal(have, want) && !slices.Equal(have, []string{want[1], want[0]}) {
			return fmt.Sprintf("blocks %v, want %v", have, want)
		}
		return ""
	})
	if reqs := listRequests(t, c); len(reqs) != 0 {
		t.Errorf("BlockRequest %s exists: nothing makes them any more", reqs[0].Name)
	}
}

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/controller"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/test/cluster"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// clusterWait bounds every wait of TestKubeCluster: generous for a loaded
// two-core machine, short enough that a hang fails the test.
const clusterWait = 45 * time.Second

// eventually polls cond (which returns "" when satisfied, else what it
// sees) until clusterWait has passed.
func eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	kubenode.Eventually(t, clusterWait, what, cond)
}

// clusterPod is one pod attached on one node.
type clusterPod struct {
	*pod
	node, namespace string
}

// attach ADDs a pod in namespace on n through libcni with the kubelet's
// CNI_ARGS; safe from several goroutines.
func attach(t *testing.T, n *kubeNode, l *libcni.NetworkConfigList, namespace, id string) (*clusterPod, error) {
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT(id, ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", id}}
	r, err := n.add(t, l, rt)
	if err != nil {
		return nil, fmt.Errorf("ADD %s (namespace %s) on %s: %w", id, namespace, n.name, err)
	}
	res, err := asCurrentErr(r)
	if err != nil {
		return nil, err
	}
	return &clusterPod{pod: &pod{ns: ns, rt: rt, res: res, addrs: ctrAddrs(res, rt.IfName, ns.Path())}, node: n.name, namespace: namespace}, nil
}

func listBlocks(t *testing.T, c client.Client, opts ...client.ListOption) []skeinv1.AddressBlock {
	t.Helper()
	var l skeinv1.AddressBlockList
	if err := c.List(context.Background(), &l, opts...); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func listRequests(t *testing.T, c client.Client, opts ...client.ListOption) []skeinv1.BlockRequest {
	t.Helper()
	var l skeinv1.BlockRequestList
	if err := c.List(context.Background(), &l, opts...); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestKubeCluster is skein's Kubernetes mode end to end: the real API
// server, two real skein-controller processes on one Lease, and three
// nodes (network namespaces) each with a real skeind --store kubernetes
// claiming its own blocks, pods attached through libcni as the kubelet
// does. It checks that every pod's address lies in a block of its node
// and of its namespace's pool, no address or block index twice; that the
// leader SIGKILLed during a burst that needs new blocks fails no ADD (no
// controller is in the path) and the standby takes over; that a missing
// pool and an exhausted pool fail clearly with nothing half-made; that a
// pool in use stays Terminating until freed; that a restarted skeind
// keeps what is used and gives back the rest; that a deleted Node whose
// node is gone (its Lease run out, or never made) loses its blocks and
// Lease while the others keep theirs; and that once every pod is gone
// each node keeps just its spare block.
func TestKubeCluster(t *testing.T) {
	harness.RequireRoot(t)
	began := time.Now()
	kenv := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(kenv.Config)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	kc, err := kenv.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}

	// The cluster: four Nodes (kc-ghost runs no skeind; its blocks are
	// made by hand, as its claims would be), three pools, four
	// namespaces (one naming a pool that does not exist).
	nodeNames := []string{"kc-n1", "kc-n2", "kc-n3"}
	for _, n := range append(nodeNames, "kc-ghost") {
		if err := c.Create(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	pools := map[string]*skeinv1.AddressPool{}
	for _, p := range []struct{ name, v4 string }{
		{"default", "10.120.0.0/24"}, // 32 blocks of 8
		{"blue", "10.121.0.0/26"},    // 8 blocks of 8
		{"tiny", "10.122.0.0/29"},    // 1 block
	} {
		pools[p.name] = &skeinv1.AddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec:       skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(p.v4)}}, BlockSizeBits: 3},
		}
		if err := c.Create(bg, pools[p.name]); err != nil {
			t.Fatal(err)
		}
	}
	for name, pool := range map[string]string{"skein-system": "", "plain": "", "team-blue": "blue", "team-tiny": "tiny", "team-none": "no-such-pool"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if pool != "" {
			ns.Annotations = map[string]string{skeinv1.AnnotationPool: pool}
		}
		if err := c.Create(bg, ns); err != nil {
			t.Fatal(err)
		}
	}
	poolOfNS := map[string]string{"plain": "default", "team-blue": "blue"}

	// Short Leases and grace, so that a node gone for good is collected
	// within the test's waits.
	grace := []string{"--node-gc-grace", "3s"}
	ctrls := []*cluster.Controller{cluster.StartController(t, kc, "ctrl-a", grace...), cluster.StartController(t, kc, "ctrl-b", grace...)}
	nodes := map[string]*kubeNode{}
	lists := map[string]*libcni.NetworkConfigList{}
	for _, n := range nodeNames {
		nodes[n] = startKubeNode(t, kc, n, "--lease-duration", "4s", "--block-min-age", "2s")
		lists[n] = skeintest.ConfList(t, "kube", "1.1.0", nodes[n].d.SkeinPlugin(nil))
	}

	var (
		mu   sync.Mutex
		pods []*clusterPod
	)
	// burst ADDs per pods in namespace on every node at once.
	burst := func(prefix, namespace string, per int) {
		var wg sync.WaitGroup
		for _, n := range nodeNames {
			wg.Go(func() {
				for i := range per {
					p, err := attach(t, nodes[n], lists[n], namespace, fmt.Sprintf("%s-%s-%d", prefix, n, i))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					pods = append(pods, p)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}

	// A first burst: each node claims a block or two.
	burst("a", "plain", 5)
	burst("b", "team-blue", 1)
	if t.Failed() {
		t.FailNow()
	}
	leader := cluster.Leader(t, clusterWait, ctrls...)
	standby := ctrls[0]
	if standby == leader {
		standby = ctrls[1]
	}

	// The leader SIGKILLed in the middle of a burst (once a block of it
	// has been claimed): the nodes claim their blocks themselves, so no
	// ADD fails or waits for the standby, which takes the Lease.
	before := len(listBlocks(t, c))
	var wg sync.WaitGroup
	wg.Go(func() { burst("c", "plain", 12) })
	// Nothing here ends the test while the burst's goroutines run.
	underway := false
	for deadline := time.Now().Add(clusterWait); !underway && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var l skeinv1.AddressBlockList
		underway = c.List(bg, &l) == nil && len(l.Items) > before
	}
	if !underway {
		wg.Wait()
		t.Fatalf("no block claimed for the burst within %v", clusterWait)
	}
	leader.Kill(t)
	killed := time.Now()
	atKill := len(listBlocks(t, c))
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("the burst ended %v after the leader was killed; %d blocks claimed after the kill",
		time.Since(killed).Round(time.Millisecond), len(listBlocks(t, c))-atKill)
	if now := cluster.Leader(t, clusterWait, standby); now != standby {
		t.Errorf("the standby %s does not lead after the leader was killed", standby.Name)
	}

	// Every address in a block of its node and its namespace's pool, no
	// address twice, no block index twice in a pool, every block named
	// <pool>-<index> and claimed by a node that runs skeind.
	blocks := listBlocks(t, c)
	for _, p := range cluster.BlockProblems(blocks) {
		t.Error(p)
	}
	for _, b := range blocks {
		if !slices.Contains(nodeNames, b.NodeName) {
			t.Errorf("block %s is owned by %q, a node that runs no skeind", b.Name, b.NodeName)
		}
	}
	seenAddr := map[netip.Addr]string{}
	for _, p := range pods {
		if len(p.addrs) != 1 {
			t.Errorf("pod %s has addresses %v, want one IPv4", p.rt.ContainerID, p.addrs)
			continue
		}
		a := p.addrs[0]
		if prev, dup := seenAddr[a]; dup {
			t.Errorf("address %s given to both %s and %s", a, prev, p.rt.ContainerID)
		}
		seenAddr[a] = p.rt.ContainerID
		b := blockOf(t, c, a)
		switch {
		case b == nil:
			t.Errorf("pod %s's address %s is in no AddressBlock", p.rt.ContainerID, a)
		case b.NodeName != p.node || b.Labels[skeinv1.LabelPool] != poolOfNS[p.namespace]:
			t.Errorf("pod %s on %s in namespace %s got %s from block %s of node %q, labelled %v: want node %s, pool %s",
				p.rt.ContainerID, p.node, p.namespace, a, b.Name, b.NodeName, b.Labels, p.node, poolOfNS[p.namespace])
		}
	}
	if len(pods) != 3*(5+1+12) {
		t.Errorf("%d pods attached, want %d", len(pods), 3*(5+1+12))
	}

	// Bad input: a namespace naming a pool that does not exist. The ADD
	// fails saying so, leaving no link, no attachment and no block.
	n1 := nodes["kc-n1"]
	linksBefore := hostLinks(t, n1.d.Node)
	attsBefore := len(n1.d.Attachments(t))
	_, err = attach(t, n1, lists["kc-n1"], "team-none", "nopool-pod")
	wantCode(t, "ADD in namespace team-none, whose pool does not exist", err, types.ErrInvalidNetworkConfig)
	if err != nil && !strings.Contains(err.Error(), `"no-such-pool"`) {
		t.Errorf("ADD in a namespace naming a missing pool: %v; want an error naming pool no-such-pool", err)
	}

	// Bad input: a pool with no block left. kc-ghost holds tiny's only
	// block; an ADD in team-tiny then fails clearly, leaving no link, no
	// attachment and no block of tiny on the node.
	tinyBlock := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("tiny", 0), Finalizers: []string{skeinv1.FinalizerBlock},
			Labels: map[string]string{skeinv1.LabelPool: "tiny", skeinv1.LabelNode: "kc-ghost"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: skeinv1.GroupVersion.String(), Kind: "AddressPool",
				Name: "tiny", UID: pools["tiny"].UID, BlockOwnerDeletion: ptr.To(false)}}},
		NodeName: "kc-ghost", Index: 0, IPv4: ptr.To("10.122.0.0/29"),
	}
	if err := c.Create(bg, tinyBlock); err != nil {
		t.Fatal(err)
	}
	_, err = attach(t, n1, lists["kc-n1"], "team-tiny", "tiny-pod")
	wantCode(t, "ADD in namespace team-tiny, whose pool tiny has no block left", err, cni.CodePoolExhausted)
	if err != nil && (!strings.Contains(err.Error(), `pool "tiny"`) || !strings.Contains(err.Error(), "no free address")) {
		t.Errorf("ADD in an exhausted pool: %v; want an error naming pool tiny and saying it has no free address", err)
	}
	if got := hostLinks(t, n1.d.Node); strings.Join(got, ",") != strings.Join(linksBefore, ",") {
		t.Errorf("the failed ADDs left links: %v, before %v", got, linksBefore)
	}
	if got := len(n1.d.Attachments(t)); got != attsBefore {
		t.Errorf("the failed ADDs left an attachment: %d, before %d", got, attsBefore)
	}
	if bl := listBlocks(t, c, client.MatchingLabels{skeinv1.LabelPool: "no-such-pool"}); len(bl) != 0 {
		t.Errorf("the ADD in a missing pool left block %s", bl[0].Name)
	}
	if bl := listBlocks(t, c, client.MatchingLabels{skeinv1.LabelPool: "tiny"}); len(bl) != 1 || bl[0].NodeName != "kc-ghost" {
		t.Errorf("pool tiny's blocks %v: want only kc-ghost's", bl)
	}

	// A pool in use is not deleted: it stays Terminating with its
	// finalizer until the last pod of it goes. The finalizer is the
	// controller's, and nothing so far waited for a controller (the
	// nodes claim blocks without one; a leader has been seen to take
	// more than 6 s to start its controllers): wait for it.
	eventually(t, "the controller's finalizer on pool blue", func() string {
		p := &skeinv1.AddressPool{}
		if err := c.Get(bg, client.ObjectKey{Name: "blue"}, p); err != nil {
			return "get: " + err.Error()
		}
		if !slices.Contains(p.Finalizers, skeinv1.FinalizerPool) {
			return fmt.Sprintf("finalizers %v", p.Finalizers)
		}
		return ""
	})
	if err := c.Delete(bg, &skeinv1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool blue marked as being deleted", func() string {
		p := &skeinv1.AddressPool{}
		if err := c.Get(bg, client.ObjectKey{Name: "blue"}, p); err != nil {
			return "get: " + err.Error()
		}
		if p.DeletionTimestamp == nil || !strings.Contains(fmt.Sprint(p.Finalizers), skeinv1.FinalizerPool) {
			return fmt.Sprintf("deletion %v, finalizers %v", p.DeletionTimestamp, p.Finalizers)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Reason == controller.ReasonDeleting {
				return ""
			}
		}
		return fmt.Sprintf("conditions %v", p.Status.Conditions)
	})
	time.Sleep(time.Second) // the controller has had its chance to get this wrong
	if bl := listBlocks(t, c, client.MatchingLabels{skeinv1.LabelPool: "blue"}); len(bl) != 3 {
		t.Errorf("pool blue has %d blocks while its 3 pods run, want 3", len(bl))
	}
	if err := c.Get(bg, client.ObjectKey{Name: "blue"}, &skeinv1.AddressPool{}); err != nil {
		t.Errorf("pool blue in use was deleted: %v", err)
	}
	var rest []*clusterPod
	for _, p := range pods {
		if p.namespace == "team-blue" {
			nodes[p.node].mustDel(t, lists[p.node], p.rt)
		} else {
			rest = append(rest, p)
		}
	}
	pods = rest
	eventually(t, "pool blue gone once its pods are", func() string {
		if err := c.Get(bg, client.ObjectKey{Name: "blue"}, &skeinv1.AddressPool{}); err == nil {
			return "still there"
		}
		return ""
	})

	// skeind on kc-n1 crashes right after a claim whose answer it never
	// read: the block is kc-n1's in the API server, unknown to it.
	// Restarted, it keeps the blocks its pods use and gives that one back.
	n1.d.Kill(t)
	used := map[string]bool{}
	for _, p := range pods {
		if p.node == "kc-n1" {
			used[blockOf(t, c, p.addrs[0]).Name] = true
		}
	}
	stray := strayBlock(t, c, pools["default"], "kc-n1")
	n1.d.Start(t)
	eventually(t, "kc-n1's blocks after its restart", func() string {
		var have []string
		for _, b := range listBlocks(t, c, client.MatchingLabels{skeinv1.LabelNode: "kc-n1"}) {
			have = append(have, b.Name)
		}
		// Its pods leave more than a quarter of a block free in the
		// blocks they use: no spare is kept besides.
		if slices.Contains(have, stray) || len(have) != len(used) {
			return fmt.Sprintf("blocks %v, want those in use %v", have, used)
		}
		return ""
	})
	for b := range used {
		if err := c.Get(bg, client.ObjectKey{Name: b}, &skeinv1.AddressBlock{}); err != nil {
			t.Errorf("block %s, in use on kc-n1, after the restart: %v", b, err)
		}
	}
	for _, p := range pods {
		if p.node == "kc-n1" {
			if err := n1.check(t, lists["kc-n1"], p.rt); err != nil {
				t.Errorf("CHECK %s after skeind's restart: %v", p.rt.ContainerID, err)
			}
		}
	}

	// Nodes deleted from the API and gone for good lose their blocks and
	// Leases: kc-ghost (no Lease ever: judged by its newest block's age;
	// its block of tiny goes), and kc-n3, whose skeind is gone with its
	// host (once its Lease has run out, plus the grace).
	nodes["kc-n3"].d.Kill(t)
	for _, n := range []string{"kc-ghost", "kc-n3"} {
		if err := c.Delete(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "deleted nodes' blocks and Leases removed", func() string {
		for _, n := range []string{"kc-ghost", "kc-n3"} {
			for _, b := range listBlocks(t, c) {
				if b.NodeName == n {
					return "block " + b.Name + " of " + n
				}
			}
			if l := nodeLease(t, c, n); l != nil {
				return "the Lease of " + n
			}
		}
		return ""
	})
	if bl := listBlocks(t, c, client.MatchingLabels{skeinv1.LabelNode: "kc-n2"}); len(bl) == 0 {
		t.Error("kc-n2 lost its blocks although its Node is still there")
	}

	// The live nodes let go of everything but a spare block of the
	// default pool each (--block-min-age 2s); no BlockRequest was made.
	for _, p := range pods {
		if p.node != "kc-n3" {
			nodes[p.node].mustDel(t, lists[p.node], p.rt)
		}
	}
	for _, n := range []string{"kc-n1", "kc-n2"} {
		nodes[n].assertNothingLeft(t)
	}
	eventually(t, "the blocks left to be the live nodes' spares", func() string {
		var have []string
		for _, b := range listBlocks(t, c) {
			have = append(have, b.Labels[skeinv1.LabelPool]+"/"+b.NodeName)
		}
		slices.Sort(have)
		if want := []string{"default/kc-n1", "default/kc-n2"}; !slices.Equal(have, want) {
			return fmt.Sprintf("blocks (pool/node) %v, want %v", have, want)
		}
		return ""
	})
	if reqs := listRequests(t, c); len(reqs) != 0 {
		t.Errorf("BlockRequest %s exists: nothing makes them any more", reqs[0].Name)
	}
	t.Logf("the cluster test ran for %v", time.Since(began).Round(time.Millisecond))
}

// strayBlock creates a block of pool for node as its claim would (the
// next index no block has), and returns its name.
func strayBlock(t *testing.T, c client.Client, pool *skeinv1.AddressPool, node string) string {
	t.Helper()
	taken := map[int64]bool{}
	for _, b := range listBlocks(t, c, client.MatchingLabels{skeinv1.LabelPool: pool.Name}) {
		taken[b.Index] = true
	}
	geo, err := ipam.NewGeometry([]netip.Prefix{netip.MustParsePrefix(*pool.Spec.Subnets[0].IPv4)}, int(pool.Spec.BlockSizeBits), nil)
	if err != nil {
		t.Fatal(err)
	}
	i := int64(geo.Blocks()) - 1
	for ; taken[i]; i-- {
	}
	v4, _ := geo.BlockPrefixes(uint32(i))
	b := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName(pool.Name, uint32(i)), Finalizers: []string{skeinv1.FinalizerBlock},
			Labels: map[string]string{skeinv1.LabelPool: pool.Name, skeinv1.LabelNode: node},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: skeinv1.GroupVersion.String(), Kind: "AddressPool",
				Name: pool.Name, UID: pool.UID, BlockOwnerDeletion: ptr.To(false)}}},
		NodeName: node, Index: i, IPv4: ptr.To(v4.String()),
	}
	if err := c.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return b.Name
}

// nodeLease returns node's liveness Lease (nil if there is none).
func nodeLease(t *testing.T, c client.Client, node string) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{}
	err := c.Get(context.Background(), client.ObjectKey{Namespace: "skein-system", Name: skeinv1.NodeLeaseName(node)}, l)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

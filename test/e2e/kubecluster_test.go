package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/controller"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// clusterWait bounds every wait of TestKubeCluster: generous for a loaded
// two-core machine, short enough that a hang fails the test.
const clusterWait = 45 * time.Second

const (
	leading = `leader_election_master_status{name="skein-controller"}`
	served  = `skein_blockrequests_total{result="Complete"}`
)

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
// nodes (network namespaces) each with a real skeind --store kubernetes,
// pods attached through libcni as the kubelet does. It checks that every
// pod's address lies in a block of its node and of its namespace's pool,
// no address or block index twice; that the leader SIGKILLed during a
// burst leaves nothing unserved; that a missing pool and an exhausted
// pool fail clearly with nothing half-made; that a pool in use stays
// Terminating until freed; that a restarted skeind keeps what is used and
// frees the rest; and that a Node deleted from the API loses its blocks.
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

	// The cluster: four Nodes (kc-ghost runs no skeind; the test makes
	// its requests by hand), three pools, three namespaces.
	nodeNames := []string{"kc-n1", "kc-n2", "kc-n3"}
	for _, n := range append(nodeNames, "kc-ghost") {
		if err := c.Create(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []struct{ name, v4 string }{
		{"default", "10.120.0.0/24"}, // 32 blocks of 8
		{"blue", "10.121.0.0/26"},    // 8 blocks of 8
		{"tiny", "10.122.0.0/29"},    // 1 block
	} {
		if err := c.Create(bg, &skeinv1.AddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec:       skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(p.v4)}}, BlockSizeBits: 3},
		}); err != nil {
			t.Fatal(err)
		}
	}
	for name, pool := range map[string]string{"plain": "", "team-blue": "blue", "team-tiny": "tiny"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if pool != "" {
			ns.Annotations = map[string]string{skeinv1.AnnotationPool: pool}
		}
		if err := c.Create(bg, ns); err != nil {
			t.Fatal(err)
		}
	}
	poolOfNS := map[string]string{"plain": "default", "team-blue": "blue"}

	ctrls := []*kubenode.Controller{kubenode.StartController(t, kc, "ctrl-a"), kubenode.StartController(t, kc, "ctrl-b")}
	nodes := map[string]*kubeNode{}
	lists := map[string]*libcni.NetworkConfigList{}
	for _, n := range nodeNames {
		nodes[n] = startKubeNode(t, kc, n, "--block-wait", "30s")
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

	// A first burst: the leader carves each node a block or two.
	burst("a", "plain", 5)
	burst("b", "team-blue", 1)
	if t.Failed() {
		t.FailNow()
	}
	var leader, standby *kubenode.Controller
	eventually(t, "one controller leading", func() string {
		a, b := ctrls[0].Sample(t, leading), ctrls[1].Sample(t, leading)
		switch {
		case a == "1" && b != "1":
			leader, standby = ctrls[0], ctrls[1]
		case b == "1" && a != "1":
			leader, standby = ctrls[1], ctrls[0]
		default:
			return fmt.Sprintf("leader_election_master_status %q and %q", a, b)
		}
		return ""
	})
	if leader.Sample(t, served) == "" {
		t.Errorf("the leader %s served none of the first burst", leader.Name)
	}

	// The leader SIGKILLed in the middle of a burst (once it has carved
	// a block of it): pods that need new blocks, and requests made by
	// hand for kc-ghost after the kill, wait for the standby to take the
	// Lease, which then serves every one of them.
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
		t.Fatalf("no block carved for the burst within %v", clusterWait)
	}
	leader.Kill(t)
	killed := time.Now()
	var ghostReqs []string
	for range 4 {
		br := &skeinv1.BlockRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "kc-ghost-"},
			Spec:       skeinv1.BlockRequestSpec{NodeName: "kc-ghost", PoolName: "default"},
		}
		if err := c.Create(bg, br); err != nil {
			t.Error(err)
			continue
		}
		ghostReqs = append(ghostReqs, br.Name)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	eventually(t, "every request of kc-ghost complete", func() string {
		done := 0
		for _, br := range listRequests(t, c) {
			if br.Spec.NodeName == "kc-ghost" && meta.IsStatusConditionTrue(br.Status.Conditions, skeinv1.ConditionComplete) {
				done++
			}
		}
		if done < len(ghostReqs) {
			return fmt.Sprintf("%d of %d complete", done, len(ghostReqs))
		}
		return ""
	})
	t.Logf("the burst and kc-ghost's requests were served %v after the leader was killed", time.Since(killed).Round(time.Millisecond))
	if standby.Sample(t, leading) != "1" || standby.Sample(t, served) == "" {
		t.Errorf("the standby %s does not lead or served nothing after the leader was killed", standby.Name)
	}

	// Every address in a block of its node and its namespace's pool, no
	// address twice, no block index twice in a pool, every block owned
	// by a node that asked for it.
	blocks := listBlocks(t, c)
	seenIdx := map[string]string{}
	for _, b := range blocks {
		key := fmt.Sprintf("%s/%d", b.Labels[skeinv1.LabelPool], b.Index)
		if prev, dup := seenIdx[key]; dup {
			t.Errorf("pool %s index %d in blocks %s and %s", b.Labels[skeinv1.LabelPool], b.Index, prev, b.Name)
		}
		seenIdx[key] = b.Name
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
		case b.Labels[skeinv1.LabelNode] != p.node || b.Labels[skeinv1.LabelPool] != poolOfNS[p.namespace]:
			t.Errorf("pod %s on %s in namespace %s got %s from block %s labelled %v: want node %s, pool %s",
				p.rt.ContainerID, p.node, p.namespace, a, b.Name, b.Labels, p.node, poolOfNS[p.namespace])
		}
	}
	if len(pods) != 3*(5+1+12) {
		t.Errorf("%d pods attached, want %d", len(pods), 3*(5+1+12))
	}

	// Bad input: a request for a pool that does not exist fails, saying so.
	bad := &skeinv1.BlockRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "kc-ghost-nopool"},
		Spec:       skeinv1.BlockRequestSpec{NodeName: "kc-ghost", PoolName: "no-such-pool"},
	}
	if err := c.Create(bg, bad); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the request for a missing pool to fail", func() string {
		if err := c.Get(bg, client.ObjectKeyFromObject(bad), bad); err != nil {
			return err.Error()
		}
		f := meta.FindStatusCondition(bad.Status.Conditions, skeinv1.ConditionFailed)
		if f == nil || f.Status != metav1.ConditionTrue {
			return fmt.Sprintf("conditions %v", bad.Status.Conditions)
		}
		if f.Reason != skeinv1.ReasonPoolNotFound || !strings.Contains(f.Message, "no-such-pool") {
			t.Errorf("Failed condition %s: %q, want reason %s and a message naming the pool", f.Reason, f.Message, skeinv1.ReasonPoolNotFound)
		}
		if bad.Status.AddressBlockName != "" {
			t.Errorf("the failed request names block %s", bad.Status.AddressBlockName)
		}
		return ""
	})
	if err := c.Delete(bg, bad); err != nil {
		t.Fatal(err)
	}

	// Bad input: a pool with no block left. kc-ghost takes tiny's only
	// block; an ADD in team-tiny then fails clearly, leaving no link, no
	// attachment and no BlockRequest on the node.
	tinyReq := &skeinv1.BlockRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "kc-ghost-tiny"},
		Spec:       skeinv1.BlockRequestSpec{NodeName: "kc-ghost", PoolName: "tiny"},
	}
	if err := c.Create(bg, tinyReq); err != nil {
		t.Fatal(err)
	}
	eventually(t, "kc-ghost's tiny block", func() string {
		if err := c.Get(bg, client.ObjectKeyFromObject(tinyReq), tinyReq); err != nil {
			return err.Error()
		}
		if !meta.IsStatusConditionTrue(tinyReq.Status.Conditions, skeinv1.ConditionComplete) {
			return fmt.Sprintf("conditions %v", tinyReq.Status.Conditions)
		}
		return ""
	})
	n1 := nodes["kc-n1"]
	linksBefore := hostLinks(t, n1.d.Node)
	attsBefore := len(n1.d.Attachments(t))
	_, err = attach(t, n1, lists["kc-n1"], "team-tiny", "tiny-pod")
	wantCode(t, "ADD in namespace team-tiny, whose pool tiny has no block left", err, cni.CodePoolExhausted)
	if err != nil && (!strings.Contains(err.Error(), `pool "tiny"`) || !strings.Contains(err.Error(), "no free address")) {
		t.Errorf("ADD in an exhausted pool: %v; want an error naming pool tiny and saying it has no free address", err)
	}
	if got := hostLinks(t, n1.d.Node); strings.Join(got, ",") != strings.Join(linksBefore, ",") {
		t.Errorf("the failed ADD left links: %v, before %v", got, linksBefore)
	}
	if got := len(n1.d.Attachments(t)); got != attsBefore {
		t.Errorf("the failed ADD left an attachment: %d, before %d", got, attsBefore)
	}
	if reqs := listRequests(t, c, client.MatchingLabels{skeinv1.LabelNode: "kc-n1"}); len(reqs) != 0 {
		t.Errorf("the failed ADD left BlockRequest %s", reqs[0].Name)
	}
	if bl := listBlocks(t, c, client.MatchingLabels{skeinv1.LabelPool: "tiny"}); len(bl) != 1 || bl[0].Labels[skeinv1.LabelNode] != "kc-ghost" {
		t.Errorf("pool tiny's blocks %v: want only kc-ghost's", bl)
	}

	// A pool in use is not deleted: it stays Terminating with its
	// finalizer until the last pod of it goes.
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

	// skeind on kc-n1 crashes; a block is granted to it meanwhile (as a
	// crash right after a grant leaves). Restarted, it keeps the blocks its
	// pods use and frees the stray one.
	n1.d.Kill(t)
	used := map[string]bool{}
	for _, p := range pods {
		if p.node == "kc-n1" {
			used[blockOf(t, c, p.addrs[0]).Name] = true
		}
	}
	strayReq := &skeinv1.BlockRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "kc-n1-stray"},
		Spec:       skeinv1.BlockRequestSpec{NodeName: "kc-n1", PoolName: "default"},
	}
	if err := c.Create(bg, strayReq); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stray block", func() string {
		if err := c.Get(bg, client.ObjectKeyFromObject(strayReq), strayReq); err != nil {
			return err.Error()
		}
		if strayReq.Status.AddressBlockName == "" {
			return fmt.Sprintf("conditions %v", strayReq.Status.Conditions)
		}
		return ""
	})
	if err := c.Delete(bg, strayReq); err != nil {
		t.Fatal(err)
	}
	n1.d.Start(t)
	eventually(t, "kc-n1's blocks after its restart", func() string {
		var have []string
		stray := false
		for _, b := range listBlocks(t, c, client.MatchingLabels{skeinv1.LabelNode: "kc-n1"}) {
			have = append(have, b.Name)
			stray = stray || b.Name == strayReq.Status.AddressBlockName
		}
		if stray || len(have) != len(used) {
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

	// Nodes deleted from the API lose their blocks and requests: kc-ghost
	// (which frees tiny), and kc-n3, whose skeind is gone with its host.
	nodes["kc-n3"].d.Kill(t)
	for _, n := range []string{"kc-ghost", "kc-n3"} {
		if err := c.Delete(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "deleted nodes' blocks and requests removed", func() string {
		for _, n := range []string{"kc-ghost", "kc-n3"} {
			if bl := listBlocks(t, c, client.MatchingLabels{skeinv1.LabelNode: n}); len(bl) != 0 {
				return fmt.Sprintf("%d blocks of %s", len(bl), n)
			}
			for _, br := range listRequests(t, c) {
				if br.Spec.NodeName == n {
					return "request " + br.Name + " of " + n
				}
			}
		}
		return ""
	})
	if bl := listBlocks(t, c, client.MatchingLabels{skeinv1.LabelNode: "kc-n2"}); len(bl) == 0 {
		t.Error("kc-n2 lost its blocks although its Node is still there")
	}

	// The live nodes let go of everything: no block, no request remains.
	for _, p := range pods {
		if p.node != "kc-n3" {
			nodes[p.node].mustDel(t, lists[p.node], p.rt)
		}
	}
	for _, n := range []string{"kc-n1", "kc-n2"} {
		nodes[n].assertNothingLeft(t)
	}
	eventually(t, "every block freed", func() string {
		if bl := listBlocks(t, c); len(bl) != 0 {
			return fmt.Sprintf("%d blocks left, the first %s", len(bl), bl[0].Name)
		}
		if reqs := listRequests(t, c); len(reqs) != 0 {
			return fmt.Sprintf("%d requests left", len(reqs))
		}
		return ""
	})
	t.Logf("the cluster test ran for %v", time.Since(began).Round(time.Millisecond))
}

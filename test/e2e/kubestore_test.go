package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/controller"
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

func runBlockController(t *testing.T, env *kube.Env) (stop func()) {
	t.Helper()
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 kube.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &controller.BlockRequestReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader()}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestKubeStore runs real skeind binaries with --store kubernetes against a
// real API server and the real BlockRequest reconciler: blocks come from
// BlockRequests, a namespace's annotation picks the pool, ADDs that fit in
// an owned block make no API write, emptied blocks are freed, a restart
// keeps used blocks, and no controller means "try again" (code 11) with
// nothing left behind.
func TestKubeStore(t *testing.T) {
	harness.RequireRoot(t)
	kenv := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(kenv.Config)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	stopController := runBlockController(t, kenv)
	for _, p := range []struct{ name, v4 string }{{"default", "10.90.0.0/24"}, {"blue", "10.91.0.0/24"}} {
		if err := c.Create(bg, &skeinv1.AddressPool{
			ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec:       skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(p.v4)}}, BlockSizeBits: 3},
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-blue", Annotations: map[string]string{skeinv1.AnnotationPool: "blue"}}},
	} {
		if err := c.Create(bg, ns); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := kenv.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	a := startKubeNode(t, kc, "kn-a")
	b := startKubeNode(t, kc, "kn-b", "--block-wait", "2s")
	l := skeintest.ConfList(t, "kube", "1.1.0", a.d.SkeinPlugin(nil))
	lb := skeintest.ConfList(t, "kube", "1.1.0", b.d.SkeinPlugin(nil))

	// One pod on each node: each ADD needs a block, so each makes a
	// BlockRequest; the two blocks differ and carry their node's label.
	pa := podIn(a, t, l, "plain", "pa")
	pb := podIn(b, t, lb, "plain", "pb")
	ba, bb := blockOf(t, c, pa.addrs[0]), blockOf(t, c, pb.addrs[0])
	if ba == nil || bb == nil || ba.Name == bb.Name {
		t.Fatalf("pods' blocks %v and %v: want two distinct blocks", ba, bb)
	}
	if ba.Labels[skeinv1.LabelNode] != "kn-a" || bb.Labels[skeinv1.LabelNode] != "kn-b" || ba.Labels[skeinv1.LabelPool] != "default" {
		t.Errorf("block labels %v and %v: want each node's own, pool default", ba.Labels, bb.Labels)
	}

	// More pods on kn-a fit in its block: no API write at all.
	before := a.apiWrites(t)
	if before == 0 {
		t.Fatal("skein_api_requests_total counts no write although a block was requested")
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

	// The namespace's annotation picks the pool; the last DEL frees the block.
	blue := podIn(a, t, l, "team-blue", "blue")
	bblk := blockOf(t, c, blue.addrs[0])
	if bblk == nil || bblk.Labels[skeinv1.LabelPool] != "blue" || bblk.Labels[skeinv1.LabelNode] != "kn-a" {
		t.Fatalf("pod in namespace team-blue got %v in block %v: want kn-a's block of pool blue", blue.addrs, bblk)
	}
	a.mustDel(t, l, blue.rt)
	if blk := blockOf(t, c, blue.addrs[0]); blk != nil {
		t.Errorf("block %s still exists after its last address was freed", blk.Name)
	}

	// A crash and restart keeps the block pa uses and frees a block of
	// kn-a's that nothing uses (as a crash right after a grant leaves).
	a.d.Kill(t)
	stray := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("default", 30), Finalizers: []string{skeinv1.FinalizerBlock},
			Labels: map[string]string{skeinv1.LabelPool: "default", skeinv1.LabelNode: "kn-a"}},
		Index: 30, IPv4: ptr.To("10.90.0.240/29"),
	}
	if err := c.Create(bg, stray); err != nil {
		t.Fatal(err)
	}
	a.d.Start(t)
	if blk := blockOf(t, c, pa.addrs[0]); blk == nil || blk.Name != ba.Name {
		t.Errorf("after restart pa's block is %v, want %s kept", blk, ba.Name)
	}
	if blk := blockOf(t, c, netip.MustParseAddr("10.90.0.241")); blk != nil {
		t.Errorf("after restart the unused block %s is still there", blk.Name)
	}
	if err := a.check(t, l, pa.rt); err != nil {
		t.Errorf("CHECK pa after restart: %v", err)
	}

	// No controller: an ADD that needs a block fails with code 11 after
	// the bounded wait, leaving no request, block, link or attachment.
	stopController()
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT("stuck", ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", "team-blue"}, {"K8S_POD_NAME", "stuck"}}
	start := time.Now()
	_, err = b.add(t, lb, rt)
	wantCode(t, "ADD needing a block with no controller", err, 11)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("ADD gave up after %v, want about --block-wait (2s)", took)
	}
	var reqs skeinv1.BlockRequestList
	if err := c.List(bg, &reqs); err != nil {
		t.Fatal(err)
	}
	if len(reqs.Items) != 0 {
		t.Errorf("BlockRequest %s left behind", reqs.Items[0].Name)
	}
	var blocks skeinv1.AddressBlockList
	if err := c.List(bg, &blocks, client.MatchingLabels{skeinv1.LabelPool: "blue"}); err != nil {
		t.Fatal(err)
	}
	if len(blocks.Items) != 0 {
		t.Errorf("block %s of pool blue left behind", blocks.Items[0].Name)
	}
	b.mustDel(t, lb, pb.rt)
	b.assertNothingLeft(t)
	a.mustDel(t, l, pa.rt)
	a.assertNothingLeft(t)
}

package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// apiWait bounds one API call of the tests.
const apiWait = 30 * time.Second

// world is one cluster under test.
type world struct {
	env   *kube.Env
	admin client.Client
	// kubeconfig is the admin's, for the controllers.
	kubeconfig string
	nodes      []*node
	ctrls      []*Controller
}

type worldOptions struct {
	nodes []string
	pools []skeinv1.AddressPool
	// namespaces maps a namespace to its pool ("" = none named: default).
	namespaces map[string]string
	// skeind and controller flags added to every process's own.
	skeind, controller []string
	controllers        int
}

// node is a skeind serving one node namespace with its node's own
// credentials (NodeKubeconfig).
type node struct {
	*kubenode.Node
	kubeconfig string // its node's credentials
	conf       *libcni.NetworkConfigList
	cni        *libcni.CNIConfig
	// lives are the logs of its processes before the running one.
	lives []string
	// life counts the kills and restarts of its skeind; down is set
	// from just before a kill until the restart has answered. An ADD or
	// DEL that saw both unchanged had a skeind serving all along.
	life atomic.Int64
	down atomic.Bool
}

// kill SIGKILLs the node's skeind.
func (n *node) kill(t *testing.T) {
	t.Helper()
	n.down.Store(true)
	n.life.Add(1)
	n.D.Kill(t)
}

// state is the node's skeind life and whether it is up: an operation
// that saw the same life, up, before and after it had a skeind serving
// all along.
func (n *node) state() (life int64, up bool) { return n.life.Load(), !n.down.Load() }

// startWorld starts the API server, skeind's shipped identity, the pools,
// namespaces and Nodes, the controllers, then one skeind per node.
func startWorld(t *testing.T, o worldOptions) *world {
	t.Helper()
	harness.RequireRoot(t)
	env := kube.Start(t, kube.Options{})
	admin, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{env: env, admin: admin, kubeconfig: kc}
	ctx, cancel := context.WithTimeout(context.Background(), apiWait)
	defer cancel()
	InstallIdentity(t, admin)
	for _, p := range o.pools {
		if err := admin.Create(ctx, p.DeepCopy()); err != nil {
			t.Fatalf("create pool %s: %v", p.Name, err)
		}
	}
	for name, pool := range o.namespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if pool != "" {
			ns.Annotations = map[string]string{skeinv1.AnnotationPool: pool}
		}
		if err := admin.Create(ctx, ns); err != nil {
			t.Fatalf("create namespace %s: %v", name, err)
		}
	}
	for i := range max(o.controllers, 1) {
		w.ctrls = append(w.ctrls, StartController(t, kc, fmt.Sprintf("ctrl-%c", 'a'+i), o.controller...))
	}
	for _, name := range o.nodes {
		kubenode.CreateNode(t, admin, name)
		nkc := NodeKubeconfig(t, env, name)
		kn := kubenode.StartNode(t, nkc, name, kubenode.NodeOptions{Args: o.skeind})
		n := &node{Node: kn, kubeconfig: nkc, conf: kn.ConfList(t), cni: kn.D.CNI()}
		w.nodes = append(w.nodes, n)
		t.Cleanup(func() { n.keepLogs(t) })
	}
	return w
}

// restart starts a killed skeind again, keeping the log of its last
// life. Call it from the test's goroutine.
func (n *node) restart(t *testing.T) {
	t.Helper()
	n.lives = append(n.lives, n.D.Log())
	n.D.Start(t)
	n.life.Add(1)
	n.down.Store(false)
}

// keepLogs writes the logs of the node's earlier lives to a directory
// that outlives the test, if it failed (skeintest shows the last one).
func (n *node) keepLogs(t *testing.T) {
	if !t.Failed() || len(n.lives) == 0 {
		return
	}
	dir, err := os.MkdirTemp("", "skein-cluster-logs-")
	if err != nil {
		t.Logf("keep the logs of %s: %v", n.Name, err)
		return
	}
	for i, l := range n.lives {
		path := filepath.Join(dir, fmt.Sprintf("%s-life%d.log", n.Name, i+1))
		if err := os.WriteFile(path, []byte(l), 0o644); err != nil {
			t.Logf("keep a log of %s: %v", n.Name, err)
		}
	}
	t.Logf("the logs of %s's %d earlier skeind processes are in %s", n.Name, len(n.lives), dir)
}

// pod is one successful ADD.
type pod struct {
	id, namespace string
	node          *node
	ns            *harness.NS
	rt            *libcni.RuntimeConf
	addrs         []netip.Addr // of eth0, from the result
}

func (p *pod) String() string { return fmt.Sprintf("pod %s/%s on %s", p.namespace, p.id, p.node.Name) }

// add ADDs container id (eth0) in ns through libcni, with the kubelet's
// CNI_ARGS for namespace/id. Safe from any goroutine.
func (n *node) add(ns *harness.NS, namespace, id string) (*pod, error) {
	rt := skeintest.RT(id, ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", id}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := n.cni.AddNetworkList(ctx, n.conf, rt)
	if err != nil {
		return nil, fmt.Errorf("ADD %s/%s on %s: %w", namespace, id, n.Name, err)
	}
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		return nil, fmt.Errorf("ADD %s/%s on %s: convert result: %w", namespace, id, n.Name, err)
	}
	p := &pod{id: id, namespace: namespace, node: n, ns: ns, rt: rt}
	for _, ip := range res.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(res.Interfaces) {
			continue
		}
		if i := res.Interfaces[*ip.Interface]; i.Name == rt.IfName && i.Sandbox == ns.Path() {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				p.addrs = append(p.addrs, a.Unmap())
			}
		}
	}
	slices.SortFunc(p.addrs, netip.Addr.Compare)
	return p, nil
}

// del DELs container id of namespace in ns (a pod, or an ADD that
// failed). Safe from any goroutine.
func (n *node) del(ns *harness.NS, namespace, id string) error {
	rt := skeintest.RT(id, ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", id}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := n.cni.DelNetworkList(ctx, n.conf, rt); err != nil {
		return fmt.Errorf("DEL %s/%s on %s: %w", namespace, id, n.Name, err)
	}
	return nil
}

// blocks lists every AddressBlock.
func (w *world) blocks() ([]skeinv1.AddressBlock, error) {
	ctx, cancel := context.WithTimeout(context.Background(), apiWait)
	defer cancel()
	var l skeinv1.AddressBlockList
	if err := w.admin.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list AddressBlocks: %w", err)
	}
	return l.Items, nil
}

// requests lists the BlockRequests (the retired protocol: none may
// appear).
func (w *world) requests() ([]skeinv1.BlockRequest, error) {
	ctx, cancel := context.WithTimeout(context.Background(), apiWait)
	defer cancel()
	var l skeinv1.BlockRequestList
	if err := w.admin.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list BlockRequests: %w", err)
	}
	return l.Items, nil
}

// lease reads node's liveness Lease (nil, nil when there is none).
func (w *world) lease(node string) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), apiWait)
	defer cancel()
	l := &coordinationv1.Lease{}
	err := w.admin.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: skeinv1.NodeLeaseName(node)}, l)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get Lease of %s: %w", node, err)
	}
	return l, nil
}

// seen is what a check read of one pod: its eth0 addresses.
type seen struct {
	pod   *pod
	addrs []netip.Addr
}

// readPods reads the eth0 addresses of pods from their namespaces.
func readPods(pods []*pod) ([]seen, error) {
	out := make([]seen, 0, len(pods))
	for _, p := range pods {
		a, err := PodAddrs(p.ns.Path(), "eth0")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, seen{p, a})
	}
	return out, nil
}

// podProblems checks what was read of live pods against the blocks in
// the API server: each pod's eth0 has the addresses its ADD gave it, no
// address is on two pods, and each address is in a block that its
// pod's node owns, of its namespace's pool (poolOf; nil skips that).
func podProblems(pods []seen, blocks []skeinv1.AddressBlock, poolOf func(namespace string) string) []string {
	var out []string
	on := map[netip.Addr]*pod{}
	for _, s := range pods {
		p := s.pod
		if !slices.Equal(s.addrs, p.addrs) {
			out = append(out, fmt.Sprintf("%s: eth0 has %v, its ADD gave %v", p, s.addrs, p.addrs))
		}
		for _, a := range s.addrs {
			if q, dup := on[a]; dup {
				out = append(out, fmt.Sprintf("address %s is on two pods at once: %s and %s", a, q, p))
			}
			on[a] = p
			b := Holding(blocks, a)
			switch {
			case b == nil:
				out = append(out, fmt.Sprintf("%s has %s, which is in no AddressBlock", p, a))
			case b.NodeName != p.node.Name:
				out = append(out, fmt.Sprintf("%s has %s, in block %s of node %q", p, a, b.Name, b.NodeName))
			case poolOf != nil && b.Labels[skeinv1.LabelPool] != poolOf(p.namespace):
				out = append(out, fmt.Sprintf("%s has %s, in block %s of pool %q, not %q", p, a, b.Name, b.Labels[skeinv1.LabelPool], poolOf(p.namespace)))
			}
		}
	}
	return out
}

// exportProblems reads each node's export table and names every route of
// a block that the API server says another node owns. A block of nobody
// (being freed) is not counted: its export follows its release.
func exportProblems(nodes []*node, blocks []skeinv1.AddressBlock) ([]string, error) {
	var out []string
	for _, n := range nodes {
		ex, err := Exported(n.D.Node.Path())
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, p := range ex {
			for i := range blocks {
				b := &blocks[i]
				if b.NodeName != n.Name && slices.Contains(kubenode.Prefixes(b), p) {
					out = append(out, fmt.Sprintf("node %s exports %s, block %s of node %q (uid %s)", n.Name, p, b.Name, b.NodeName, b.UID))
				}
			}
		}
	}
	return out, nil
}

// poolOf returns the pool of a namespace as o describes it.
func (o worldOptions) poolOf(namespace string) string {
	if p := o.namespaces[namespace]; p != "" {
		return p
	}
	return skeinv1.DefaultPool
}

// problems collects the violations a background checker finds, each
// stamped with the time since start; report fails the test with them.
type problems struct {
	start time.Time
	mu    sync.Mutex
	seen  []string
}

func (p *problems) add(lines ...string) {
	if len(lines) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range lines {
		p.seen = append(p.seen, fmt.Sprintf("at %v: %s", time.Since(p.start).Round(100*time.Millisecond), l))
	}
}

func (p *problems) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// report fails t with every violation (the first 50 in full).
func (p *problems) report(t *testing.T, what string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		return
	}
	shown := p.seen[:min(len(p.seen), 50)]
	t.Errorf("%s: %d violations:\n%s", what, len(p.seen), strings.Join(shown, "\n"))
}

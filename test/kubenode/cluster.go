package kubenode

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

// DefaultPool is the dual-stack pool StartCluster creates unless told
// otherwise: blocks of 8 addresses per family (/29 and /125).
var DefaultPool = skeinv1.AddressPool{
	ObjectMeta: metav1.ObjectMeta{Name: skeinv1.DefaultPool},
	Spec: skeinv1.AddressPoolSpec{
		Subnets:       []skeinv1.SubnetSet{{IPv4: ptr.To("10.130.0.0/24"), IPv6: ptr.To("fd00:130::/120")}},
		BlockSizeBits: 3,
	},
}

// ClusterOptions shapes StartCluster.
type ClusterOptions struct {
	// Topology holds the node namespaces, one skeind each; required.
	Topology *harness.Topology
	// NodeName names node i; default "n<i+1>".
	NodeName func(i int) string
	// Args returns the extra skeind flags of node i; nil = none.
	Args func(n *harness.TopoNode) []string
	// Pools to create before any skeind starts; nil = DefaultPool.
	Pools []skeinv1.AddressPool
	// NoAddresses leaves the Node objects without InternalIPs.
	NoAddresses bool
	// ControllerArgs are extra skein-controller flags (StartController's
	// extra); nil = none.
	ControllerArgs []string
}

// Cluster is a real API server, one skein-controller and one skeind per
// node namespace of a Topology, each with its Node object.
type Cluster struct {
	Kube       *kube.Env
	Client     client.Client
	Kubeconfig string
	Controller *Controller
	Topology   *harness.Topology
	// Nodes[i] serves Topology.Nodes[i].
	Nodes []*Node

	opts ClusterOptions
}

// StartCluster starts the API server, creates the pools and a Node object
// per node namespace (InternalIPs = its underlay addresses), starts
// skein-controller and then the skeinds (in parallel). Everything stops at
// test cleanup.
func StartCluster(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	harness.RequireRoot(t)
	if o.Topology == nil {
		t.Fatal("kubenode.StartCluster: no topology")
	}
	if o.NodeName == nil {
		o.NodeName = func(i int) string { return fmt.Sprintf("n%d", i+1) }
	}
	if o.Pools == nil {
		o.Pools = []skeinv1.AddressPool{DefaultPool}
	}
	kenv := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(kenv.Config)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kenv.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	cl := &Cluster{Kube: kenv, Client: c, Kubeconfig: kc, Topology: o.Topology, opts: o}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range o.Pools {
		p := p.DeepCopy()
		if err := c.Create(ctx, p); err != nil {
			t.Fatalf("create pool %s: %v", p.Name, err)
		}
	}
	for i, tn := range o.Topology.Nodes {
		var addrs []netip.Addr
		if !o.NoAddresses {
			addrs = tn.Addrs()
		}
		CreateNode(t, c, o.NodeName(i), addrs...)
	}
	cl.Controller = StartController(t, kc, "skein-controller", o.ControllerArgs...)
	cl.Nodes = make([]*Node, len(o.Topology.Nodes))
	var wg sync.WaitGroup
	for i, tn := range o.Topology.Nodes {
		var args []string
		if o.Args != nil {
			args = o.Args(tn)
		}
		wg.Go(func() { cl.Nodes[i] = StartNode(t, kc, o.NodeName(i), NodeOptions{NS: tn.NS, Args: args}) })
	}
	wg.Wait()
	for _, n := range cl.Nodes {
		if n == nil { // StartNode failed on its goroutine (t.Fatal there only ends that one)
			t.FailNow()
		}
	}
	return cl
}

// Pod is one attachment made through libcni on a node.
type Pod struct {
	NS        *harness.NS
	RT        *libcni.RuntimeConf
	Result    *types100.Result
	Addrs     []netip.Addr // of eth0, from the result
	Node      *Node
	Namespace string
}

// Addr returns the pod's address of one family (invalid if it has none).
func (p *Pod) Addr(v6 bool) netip.Addr {
	for _, a := range p.Addrs {
		if a.Is6() == v6 {
			return a
		}
	}
	return netip.Addr{}
}

// ConfList is the one-plugin conflist ("kube", skein) pods on n use.
func (n *Node) ConfList(t testing.TB) *libcni.NetworkConfigList {
	t.Helper()
	return skeintest.ConfList(t, "kube", "1.1.0", n.D.SkeinPlugin(nil))
}

// AddPod makes a pod namespace and ADDs it (eth0) on n through libcni with
// the kubelet's CNI_ARGS for namespace/id. Safe from several goroutines.
func (n *Node) AddPod(t testing.TB, namespace, id string) (*Pod, error) {
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT(id, ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", id}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := n.D.CNI().AddNetworkList(ctx, n.ConfList(t), rt)
	if err != nil {
		return nil, fmt.Errorf("ADD %s (namespace %s) on %s: %w", id, namespace, n.Name, err)
	}
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		return nil, fmt.Errorf("ADD %s on %s: convert result: %w", id, n.Name, err)
	}
	p := &Pod{NS: ns, RT: rt, Result: res, Node: n, Namespace: namespace}
	for _, ip := range res.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(res.Interfaces) {
			continue
		}
		if i := res.Interfaces[*ip.Interface]; i.Name == rt.IfName && i.Sandbox == ns.Path() {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				p.Addrs = append(p.Addrs, a.Unmap())
			}
		}
	}
	return p, nil
}

// MustAddPod is AddPod calling t.Fatal on failure.
func (n *Node) MustAddPod(t testing.TB, namespace, id string) *Pod {
	t.Helper()
	p, err := n.AddPod(t, namespace, id)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Del DELs the pod on its node through libcni (its namespace stays until
// cleanup).
func (p *Pod) Del(t testing.TB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Node.D.CNI().DelNetworkList(ctx, p.Node.ConfList(t), p.RT); err != nil {
		return fmt.Errorf("DEL %s on %s: %w", p.RT.ContainerID, p.Node.Name, err)
	}
	return nil
}

// Blocks lists the AddressBlocks in the API, of node (all if node is "").
func (cl *Cluster) Blocks(t testing.TB, node string) []skeinv1.AddressBlock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var opts []client.ListOption
	if node != "" {
		opts = append(opts, client.MatchingLabels{skeinv1.LabelNode: node})
	}
	var l skeinv1.AddressBlockList
	if err := cl.Client.List(ctx, &l, opts...); err != nil {
		t.Fatalf("list blocks: %v", err)
	}
	return l.Items
}

// BlockOf returns the AddressBlock holding addr (nil if none).
func (cl *Cluster) BlockOf(t testing.TB, addr netip.Addr) *skeinv1.AddressBlock {
	t.Helper()
	for _, b := range cl.Blocks(t, "") {
		for _, s := range []*string{b.IPv4, b.IPv6} {
			if s != nil && netip.MustParsePrefix(*s).Contains(addr) {
				return &b
			}
		}
	}
	return nil
}

// Prefixes returns the block's prefixes, IPv4 first.
func Prefixes(b *skeinv1.AddressBlock) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []*string{b.IPv4, b.IPv6} {
		if s != nil {
			out = append(out, netip.MustParsePrefix(*s))
		}
	}
	return out
}

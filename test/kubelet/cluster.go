package kubelet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

// The cluster's addresses: the underlay bridge (in the control plane's
// namespace, which the API server listens in), the nodes on it, and the
// Service range.
const (
	bridgeV4     = "10.99.0.1"
	bridgeV6     = "fd99::1"
	serviceRange = "10.0.0.0/24"
	// KubernetesServiceIP is the API server's ClusterIP (the range's
	// first address), which pods and skeind's in-cluster client use.
	KubernetesServiceIP = "10.0.0.1"
	// PodCIDRs are the pools the tests make, kube-proxy's clusterCIDR.
	PodCIDRs = "10.244.0.0/16,fd00:244::/48"
)

// Options shape a cluster.
type Options struct {
	// Nodes is how many nodes (default 2).
	Nodes int
	// ProxyMode is kube-proxy's mode: iptables (default) or nftables.
	ProxyMode string
}

// Cluster is a control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) in one network namespace and
// nodes on a bridge there, each a kubelet, containerd and kube-proxy.
type Cluster struct {
	Env   *kube.Env
	Nodes []*Node
	// CP is the control plane's namespace (holding the bridge).
	CP *harness.NS
	// Client is the admin's client, dialling into CP.
	Client client.Client
	// Dir holds the images and node directories (removed at the end).
	Dir string
	// Root is the skein module's directory.
	Root string

	scheduler *kube.Process
	proxyMode string
}

// Prerequisites returns why a cluster cannot run here, "" if it can.
func Prerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl", kube.ControllerManagerBinary, "kubelet", "kube-proxy", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(kube.AssetsDir(), b)); err != nil {
			return fmt.Sprintf("no %s in %s: run scripts/install-deps.sh (make deps) to build it", b, kube.AssetsDir())
		}
	}
	if _, err := os.Stat(filepath.Join(ReferencePluginDir, "loopback")); err != nil {
		return "no reference CNI plugins in " + ReferencePluginDir + ": run scripts/install-deps.sh (make deps)"
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "unshare", "iptables", "ip6tables", "nft"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Sprintf("no %s on PATH: run scripts/install-deps.sh (make deps)", b)
		}
	}
	return ""
}

// Start brings a cluster up: the control plane, then each node with its
// containerd (holding the skein, pause and busybox images made here), its
// kubelet and kube-proxy, and waits until every Node is registered. skein
// is not installed: that is Install's (kubectl apply -k, as an operator
// does). Everything is stopped and removed at the end of the test.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	if why := Prerequisites(); why != "" {
		t.Skipf("skipping: a Kubernetes node %s", why)
	}
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.ProxyMode == "" {
		o.ProxyMode = "iptables"
	}
	start := time.Now()
	root, err := kube.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := skeintest.Binaries(t)
	dir, err := os.MkdirTemp("", "skein-kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &Cluster{Dir: dir, Root: root, proxyMode: o.ProxyMode}

	c.CP = harness.NewNS(t, "kcp")
	if out, err := c.CP.Exec(t, "sh", "-c", fmt.Sprintf(`set -e
ip link add br0 type bridge
ip link set br0 up
ip addr add %s/24 dev br0
ip addr add %s/64 dev br0 nodad`, bridgeV4, bridgeV6)); err != nil {
		t.Fatalf("bridge: %v\n%s", err, out)
	}

	users := []kube.User{{Name: "system:kube-proxy"}}
	for i := 1; i <= o.Nodes; i++ {
		users = append(users, kube.User{Name: "system:node:" + nodeName(i), Groups: []string{"system:nodes"}})
	}
	c.Env = kube.Start(t, kube.Options{
		NoCRDs:     true,
		Users:      users,
		NetNS:      c.CP.Path(),
		Address:    bridgeV4,
		ServingIPs: []net.IP{net.ParseIP(KubernetesServiceIP)},
		APIServerArgs: []string{
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			"--disable-admission-plugins=DefaultStorageClass",
			"--allow-privileged=true",
			"--service-cluster-ip-range=" + serviceRange,
			// The kubernetes Service's endpoint is this address.
			"--endpoint-reconciler-type=lease",
			// Webhooks are called at their Service's endpoints: the
			// control plane has no kube-proxy of its own.
			"--enable-aggregator-routing=true",
			"--kubelet-preferred-address-types=InternalIP",
		},
	})
	c.Env.StartControllerManagerArgs(t, []string{
		"deployment-controller", "replicaset-controller", "daemonset-controller",
		"serviceaccount-controller", "serviceaccount-token-controller",
		"endpoints-controller", "endpointslice-controller", "endpointslice-mirroring-controller",
		"garbage-collector-controller", "namespace-controller", "root-ca-certificate-publisher-controller",
		"clusterrole-aggregation-controller", "disruption-controller",
		// Takes off the not-ready taint a kubelet registers its Node with.
		"node-lifecycle-controller",
	}, []string{
		"--service-account-private-key-file=" + c.Env.SAKeyFile(),
		"--root-ca-file=" + c.Env.CAFile,
	})
	admin, err := c.Env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	c.scheduler, err = kube.StartProcess("kube-scheduler", "nsenter", []string{"--net=" + c.CP.Path(), "--",
		filepath.Join(kube.AssetsDir(), "kube-scheduler"), "--kubeconfig=" + admin, "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port=0"}, filepath.Join(dir, "kube-scheduler.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of kube-scheduler's log:\n%s", c.scheduler.Tail(20))
		}
		c.scheduler.Stop(10 * time.Second)
	})
	c.Client, err = client.New(c.Env.Config, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	imgs := images(t, dir, bin, root)
	proxyKC, err := c.Env.WriteKubeconfig("system:kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= o.Nodes; i++ {
		n := &Node{
			Name:   nodeName(i),
			NS:     harness.NewNS(t, fmt.Sprintf("kn%d", i)),
			IPv4:   fmt.Sprintf("10.99.0.%d", 10+i),
			IPv6:   fmt.Sprintf("fd99::%d", 10+i),
			Dir:    filepath.Join(dir, nodeName(i)),
			cgroup: "skein-" + harness.RandHex(3) + "-" + nodeName(i),
		}
		c.Nodes = append(c.Nodes, n)
		c.wire(t, n, i)
		t.Cleanup(func() {
			if t.Failed() {
				for _, p := range []*kube.Process{n.kubelet, n.containerd, n.proxy} {
					if p != nil {
						t.Logf("last lines of %s's log:\n%s", n.Name+" "+filepath.Base(p.Log()), p.Tail(20))
					}
				}
			}
			n.stop(t)
		})
		n.startNamespace(t)
		n.startContainerd(t, imgs)
		kc, err := c.Env.WriteKubeconfig("system:node:" + n.Name)
		if err != nil {
			t.Fatal(err)
		}
		n.startKubelet(t, kc)
		n.startProxy(t, proxyKC, o.ProxyMode, PodCIDRs)
	}
	for _, n := range c.Nodes {
		c.waitNode(t, n)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dump(t)
		}
	})
	t.Logf("cluster of %d nodes up in %v (control plane in %s, kube-proxy %s)", len(c.Nodes),
		time.Since(start).Round(time.Millisecond), c.CP.Name(), o.ProxyMode)
	return c
}

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// wire connects node n to the bridge: eth0 with its addresses, default
// routes through the bridge's (so that Service addresses have a route
// before kube-proxy's DNAT rewrites them).
func (c *Cluster) wire(t testing.TB, n *Node, i int) {
	t.Helper()
	peer := fmt.Sprintf("veth-n%d", i)
	if out, err := c.CP.Exec(t, "sh", "-c", fmt.Sprintf(`set -e
ip link add %[1]s type veth peer name eth0 netns %[2]s
ip link set %[1]s master br0 up`, peer, n.NS.Name())); err != nil {
		t.Fatalf("wire %s: %v\n%s", n.Name, err, out)
	}
	if out, err := n.NS.Exec(t, "sh", "-c", fmt.Sprintf(`set -e
ip link set eth0 up
ip addr add %s/24 dev eth0
ip addr add %s/64 dev eth0 nodad
ip route add default via %s
ip -6 route add default via %s`, n.IPv4, n.IPv6, bridgeV4, bridgeV6)); err != nil {
		t.Fatalf("wire %s: %v\n%s", n.Name, err, out)
	}
}

// waitNode waits until n's Node object exists.
func (c *Cluster) waitNode(t testing.TB, n *Node) {
	t.Helper()
	err := waitFor(90*time.Second, n.kubelet, func() bool {
		var node corev1.Node
		return c.Client.Get(context.Background(), client.ObjectKey{Name: n.Name}, &node) == nil
	})
	if err != nil {
		t.Fatalf("%s did not register: %v\n%s", n.Name, err, n.kubelet.Tail(40))
	}
}

// Kubectl runs kubectl as the admin in the control plane's namespace.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.Env.Kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// Install applies the test overlay of deploy/kubernetes (kubectl apply
// -k, as an operator does) and waits until skeind runs on every node and
// skein-controller is ready.
func (c *Cluster) Install(t testing.TB, overlay string) {
	t.Helper()
	start := time.Now()
	// CRDs first: the custom resources in the same apply need them served.
	c.Kubectl(t, "apply", "--server-side", "-k", overlay)
	c.Kubectl(t, "-n", "skein-system", "rollout", "status", "daemonset/skeind", "--timeout=180s")
	c.Kubectl(t, "-n", "skein-system", "rollout", "status", "deployment/skein-controller", "--timeout=180s")
	t.Logf("skein installed and ready in %v", time.Since(start).Round(time.Millisecond))
}

// CreatePool creates (or keeps) an AddressPool through the webhook.
func (c *Cluster) CreatePool(t testing.TB, name, v4, v6 string, blockBits int32) {
	t.Helper()
	p := &skeinv1.AddressPool{}
	p.Name = name
	set := skeinv1.SubnetSet{}
	if v4 != "" {
		set.IPv4 = &v4
	}
	if v6 != "" {
		set.IPv6 = &v6
	}
	p.Spec.Subnets = []skeinv1.SubnetSet{set}
	p.Spec.BlockSizeBits = blockBits
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		// The webhook may answer only once the controller has made
		// its certificate.
		if err = c.Client.Create(ctx, p.DeepCopy()); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("create pool %s: %v", name, err)
}

// PodAddrs returns a pod's addresses as the API reports them.
func PodAddrs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// dump logs what an operator would look at first when something failed:
// the pods, recent events, and the last lines of skein's pods.
func (c *Cluster) dump(t testing.TB) {
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		out, err := c.Env.Kubectl(args...)
		t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, tailLines(string(out), 40))
	}
	var pods corev1.PodList
	if err := c.Client.List(context.Background(), &pods, client.InNamespace("skein-system")); err != nil {
		return
	}
	for _, p := range pods.Items {
		for _, ct := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			out, _ := c.Env.Kubectl("-n", "skein-system", "logs", p.Name, "-c", ct.Name, "--tail=15")
			t.Logf("logs of %s/%s:\n%s", p.Name, ct.Name, out)
		}
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

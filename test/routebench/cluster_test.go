package routebench

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
)

// The real nodes are test/kubenode's: a real skeind --store kubernetes per
// node namespace of a harness.Topology, a Node object each, one
// skein-controller granting their pods' blocks.

// modeArgs are the skeind flags of node n in mode: its underlay IPv4
// address as --node-address, so that the VXLAN underlay is IPv4 as the
// hand-made pair's.
func modeArgs(n *harness.TopoNode, mode routing.Mode) []string {
	return []string{"--routing", string(mode), "--node-address", n.Addr4.String(), "--log-level", "info"}
}

// restartNode stops n's skeind and starts a new one for the same node in
// mode (with a new state directory: the convergence benchmark attaches
// no pods).
func restartNode(t testing.TB, cl *kubenode.Cluster, i int, mode routing.Mode) {
	t.Helper()
	tn := cl.Topology.Nodes[i]
	cl.Nodes[i].D.Stop(t)
	cl.Nodes[i] = kubenode.StartNode(t, cl.Kubeconfig, cl.Nodes[i].Name, kubenode.NodeOptions{NS: tn.NS, Args: modeArgs(tn, mode)})
}

// metric reads one series from n's /metrics (an error if absent).
func metric(n *kubenode.Node, series string) (float64, error) {
	v, err := kubenode.SampleErr(n.Metrics, series)
	if err == nil && v == "" {
		err = fmt.Errorf("%s: no %s in its metrics", n.Name, series)
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(v, 64)
}

// memory is skeind's process RSS and Go heap in use, in MiB, from its
// metrics.
func memory(n *kubenode.Node) (rss, heap float64, err error) {
	if rss, err = metric(n, "process_resident_memory_bytes"); err != nil {
		return 0, 0, err
	}
	if heap, err = metric(n, "go_memstats_heap_inuse_bytes"); err != nil {
		return 0, 0, err
	}
	return rss / (1 << 20), heap / (1 << 20), nil
}

// nodeObject is the Node object of a simulated node whose InternalIP is
// addr, its status as a kubelet registers it (one create, no status
// update: the simulated nodes are made in bulk).
func nodeObject(name string, addr netip.Addr) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: addr.String()},
			{Type: corev1.NodeHostName, Address: name},
		}},
	}
}

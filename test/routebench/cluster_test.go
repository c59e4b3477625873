package routebench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

// cluster is a real etcd and kube-apiserver with an admin client and a
// kubeconfig file for the binaries.
type cluster struct {
	env        *kube.Env
	c          client.Client
	kubeconfig string
}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{env: env, c: c, kubeconfig: kc}
}

// nodeObject is the Node object of a node whose InternalIP is addr, its
// status as a kubelet registers it.
func nodeObject(name string, addr netip.Addr) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: addr.String()},
			{Type: corev1.NodeHostName, Address: name},
		}},
	}
}

// createNode makes the Node object of a node whose InternalIP is addr.
func (cl *cluster) createNode(ctx context.Context, name string, addr netip.Addr) error {
	if err := cl.c.Create(ctx, nodeObject(name, addr)); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return nil
}

// startController runs one skein-controller binary (no leader election,
// no webhook) until the end of the test: it serves the real nodes'
// BlockRequests.
func (cl *cluster) startController(t testing.TB) {
	t.Helper()
	logf, err := os.Create(filepath.Join(cl.env.Dir, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(skeintest.Binaries(t), "skein-controller"),
		"--kubeconfig", cl.kubeconfig, "--metrics-addr", "0", "--health-addr", "0", "--leader-elect=false",
		"--webhook-port", "0", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
}

// skeind is a real skeind binary with --store kubernetes for one node
// namespace, its metrics on a loopback port.
type skeind struct {
	*skeintest.Daemon
	node    *node
	metrics string
}

// routingSupported reports whether the skeind binary has --routing (the
// flag lands with the API side of issue 10).
func routingSupported(t testing.TB) bool {
	out, _ := exec.Command(filepath.Join(skeintest.Binaries(t), "skeind"), "--help").CombinedOutput()
	return strings.Contains(string(out), "--routing")
}

// startSkeind runs skeind for n in mode, with n's underlay address as
// --node-address.
func (cl *cluster) startSkeind(t testing.TB, n *node, mode routing.Mode, extra ...string) *skeind {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	args := []string{"--store", "kubernetes", "--kubeconfig", cl.kubeconfig, "--node", n.name,
		"--metrics-addr", addr, "--log-level", "info",
		"--routing", string(mode), "--node-address", n.addr.String()}
	d := skeintest.StartDaemon(t, skeintest.Options{Node: n.ns, DefaultPool: []string{}, Args: append(args, extra...)})
	return &skeind{Daemon: d, node: n, metrics: "http://" + addr + "/metrics"}
}

// restart stops skeind and starts a new one for the same node in mode
// (a new state directory: the convergence benchmark attaches no pods).
func (s *skeind) restart(t testing.TB, cl *cluster, mode routing.Mode) *skeind {
	t.Helper()
	s.Stop(t)
	return cl.startSkeind(t, s.node, mode)
}

// sample reads metric series (name{labels}) from skeind's /metrics.
func (s *skeind) sample(series string) (float64, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(s.metrics)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", s.node.name, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s in its metrics", s.node.name, series)
}

// memory is skeind's process RSS and Go heap in use, in MiB, from its
// metrics.
func (s *skeind) memory() (rss, heap float64, err error) {
	if rss, err = s.sample("process_resident_memory_bytes"); err != nil {
		return 0, 0, err
	}
	if heap, err = s.sample("go_memstats_heap_inuse_bytes"); err != nil {
		return 0, 0, err
	}
	return rss / (1 << 20), heap / (1 << 20), nil
}

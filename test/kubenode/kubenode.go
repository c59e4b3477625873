// Package kubenode runs skein's Kubernetes mode for privileged tests and
// benchmarks: real skein-controller and skeind (--store kubernetes)
// binaries against the real API server of test/kube, one skeind per node
// namespace, Node objects carrying the nodes' underlay addresses, and pods
// attached through libcni with the kubelet's CNI_ARGS. Everything started
// here is stopped at test cleanup, its log shown if the test failed.
package kubenode

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
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

// Wait bounds the waits of this package (a process becoming healthy):
// generous for a loaded two-core machine, short enough that a hang fails.
const Wait = 45 * time.Second

// LoopbackAddr returns a free "127.0.0.1:port" for a process to listen on.
func LoopbackAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Sample returns the value of the sample named series ("name{labels}", as
// the exposition format prints it) at the metrics URL, "" when there is
// none. It calls t.Fatal if the endpoint cannot be read.
func Sample(t testing.TB, metricsURL, series string) string {
	t.Helper()
	v, err := SampleErr(metricsURL, series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// SampleErr is Sample returning the error instead.
func SampleErr(metricsURL, series string) (string, error) {
	resp, err := http.Get(metricsURL)
	if err != nil {
		return "", fmt.Errorf("scrape %s: %w", metricsURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("scrape %s: %s", metricsURL, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v, nil
		}
	}
	return "", sc.Err()
}

// Eventually polls cond (which returns "" when satisfied, else what it
// sees) every 100 ms until within has passed, then calls t.Fatal with
// the last thing it saw.
func Eventually(t testing.TB, within time.Duration, what string, cond func() string) {
	t.Helper()
	kube.Eventually(t, within, what, cond)
}

// Controller is a running skein-controller binary.
type Controller struct {
	Name    string
	Cmd     *exec.Cmd
	Metrics string // URL of its /metrics
	Log     string // file of its output

	done chan struct{}
}

// StartController runs skein-controller with a short Lease (5 s), a 2 s
// GC interval and no webhook, and waits until it is healthy. Extra flags
// come after these (a later flag wins: "--webhook-port", "9443" turns the
// webhook on). It is SIGTERMed at cleanup, and its log shown if the test
// failed.
func StartController(t testing.TB, kubeconfig, name string, extra ...string) *Controller {
	t.Helper()
	metricsAddr, healthAddr := LoopbackAddr(t), LoopbackAddr(t)
	p := &Controller{Name: name, done: make(chan struct{}), Metrics: "http://" + metricsAddr + "/metrics",
		Log: filepath.Join(t.TempDir(), name+".log")}
	logf, err := os.Create(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{
		"--kubeconfig", kubeconfig, "--metrics-addr", metricsAddr, "--health-addr", healthAddr,
		"--leader-elect-namespace", "kube-system", "--leader-elect-lease-duration", "5s",
		"--leader-elect-renew-deadline", "4s", "--leader-elect-retry-period", "500ms",
		"--gc-interval", "2s", "--webhook-port", "0"}, extra...)
	p.Cmd = exec.Command(filepath.Join(skeintest.Binaries(t), "skein-controller"), args...)
	p.Cmd.Stdout, p.Cmd.Stderr = logf, logf
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.Cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.Cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.Log)
			t.Logf("log of %s:\n%s", name, b)
		}
	})
	Eventually(t, Wait, name+" healthy", func() string {
		resp, err := http.Get("http://" + healthAddr + "/healthz")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return resp.Status
		}
		return ""
	})
	return p
}

// Sample returns the value of series in the controller's metrics.
func (p *Controller) Sample(t testing.TB, series string) string {
	t.Helper()
	return Sample(t, p.Metrics, series)
}

// Kill SIGKILLs the controller and waits for it to exit.
func (p *Controller) Kill(t testing.TB) {
	t.Helper()
	if err := p.Cmd.Process.Kill(); err != nil {
		t.Error(err)
	}
	<-p.done
}

// Node is a real skeind with --store kubernetes serving one node
// namespace, its metrics on a loopback port.
type Node struct {
	Name string
	D    *skeintest.Daemon
	// Metrics is the URL of skeind's /metrics.
	Metrics string
}

// NodeOptions configures StartNode. Zero values are usable.
type NodeOptions struct {
	// NS is the node namespace; nil = a new one.
	NS *harness.NS
	// Args are extra skeind flags (after the ones StartNode sets; a
	// later flag wins).
	Args []string
}

// StartNode runs skeind --store kubernetes --node name against the API
// server of kubeconfig, with no default pool (pools come from the API),
// and waits until it answers. It does not create the Node object (see
// CreateNode): without one the controller's GC deletes the node's blocks.
func StartNode(t testing.TB, kubeconfig, name string, o NodeOptions) *Node {
	t.Helper()
	LeaseNamespace(t, kubeconfig)
	addr := LoopbackAddr(t)
	args := append([]string{"--store", "kubernetes", "--kubeconfig", kubeconfig, "--node", name, "--metrics-addr", addr}, o.Args...)
	d := skeintest.StartDaemon(t, skeintest.Options{Node: o.NS, DefaultPool: []string{}, Args: args})
	// Where it bound: a port taken meanwhile is chosen again.
	return &Node{Name: name, D: d, Metrics: "http://" + d.MetricsAddr() + "/metrics"}
}

// Sample returns the value of series in skeind's metrics.
func (n *Node) Sample(t testing.TB, series string) string {
	t.Helper()
	return Sample(t, n.Metrics, series)
}

// CreateNode creates the Node object name with addrs as its InternalIPs
// (in its status, as a kubelet reports them); an existing one gets its
// addresses replaced.
func CreateNode(t testing.TB, c client.Client, name string, addrs ...netip.Addr) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, n); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create node %s: %v", name, err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			t.Fatalf("get node %s: %v", name, err)
		}
	}
	if len(addrs) == 0 {
		return n
	}
	n.Status.Addresses = nil
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	if err := c.Status().Update(ctx, n); err != nil {
		t.Fatalf("set the addresses %v of node %s: %v", addrs, name, err)
	}
	return n
}

// LeaseNamespace makes skein's namespace in the cluster of kubeconfig, as
// the manifests do, if it is not there: the nodes' liveness Leases live in
// it, and a skeind that cannot renew its Lease hands out no address.
func LeaseNamespace(t testing.TB, kubeconfig string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubestore.DefaultLeaseNamespace}}
	// A kubeconfig with skeind's own identity may not make namespaces:
	// the test that made that identity made the namespace too.
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
		t.Fatalf("create namespace %s: %v", ns.Name, err)
	}
}

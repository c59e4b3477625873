package kubescale

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/test/cluster"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

// skeind's identity as deploy/kubernetes makes it.
const (
	namespace = "skein-system"
	account   = "skeind"
)

// apply creates the objects of deploy/kubernetes/<files> as the admin and
// returns them as created.
func apply(ctx context.Context, tb testing.TB, c client.Client, files ...string) []*unstructured.Unstructured {
	tb.Helper()
	var out []*unstructured.Unstructured
	for _, f := range files {
		for _, o := range cluster.Manifests(tb, f) {
			if err := c.Create(ctx, o); err != nil {
				tb.Fatalf("%s: create %s %s: %v", f, o.GetKind(), o.GetName(), err)
			}
			out = append(out, o)
		}
	}
	return out
}

// sharedCache is the simulated nodes' one informer cache (pools,
// namespaces and every block), as skeind's own but filled once: decoding
// every block event a thousand times over would measure this process
// rather than the API server (with -watch the API server still sends
// every event to every node).
//
// Unless copies is set, it hands out its objects without deep-copying
// them (kubestore only reads what the cache returns, and copies before it
// changes anything). skeind's own cache copies: a node's claim copies
// every block of the pool, a few milliseconds of the node's own CPU with
// 4,000 blocks. A thousand nodes' copies in this one process would take
// a large share of the two cores the API server is measured on.
func sharedCache(tb testing.TB, env *kube.Env, copies bool) cache.Cache {
	c, err := cache.New(env.Config, cache.Options{Scheme: kubestore.Scheme, DefaultTransform: cache.TransformStripManagedFields(),
		DefaultUnsafeDisableDeepCopy: ptr.To(!copies)})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	for _, obj := range []client.Object{&skeinv1.AddressPool{}, &skeinv1.AddressBlock{}, &corev1.Namespace{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			tb.Fatal(err)
		}
	}
	go c.Start(ctx) //nolint:errcheck // ends with ctx
	syncCtx, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	if !c.WaitForCacheSync(syncCtx) {
		tb.Fatal("shared cache did not sync")
	}
	return c
}

type controllerProc struct {
	cmd  *exec.Cmd
	once sync.Once
}

func (p *controllerProc) stop() {
	p.once.Do(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		p.cmd.Wait()
	})
}

// startController runs the skein-controller binary as the admin, without
// leader election (one replica), metrics or probes. It keeps the pools'
// status and collects the blocks of deleted nodes, as in a cluster; with
// webhookPort it also serves the validating webhooks, the AddressBlock one
// on every claim's path (webhookConfig points the API server at it).
func startController(tb testing.TB, env *kube.Env, qps, webhookPort int) *controllerProc {
	kc, err := env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		tb.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(env.Dir, "controller.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(skeintest.Binaries(tb), "skein-controller"),
		"--kubeconfig", kc, "--metrics-addr", "0", "--health-addr", "0", "--leader-elect=false",
		"--webhook-port", strconv.Itoa(webhookPort), "--webhook-bind-address", "127.0.0.1", "--webhook-namespace", namespace,
		"--log-level", "warn",
		"--kube-api-qps", strconv.Itoa(qps), "--kube-api-burst", strconv.Itoa(2*qps))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &controllerProc{cmd: cmd}
	tb.Cleanup(p.stop)
	return p
}

// webhookConfig creates deploy/kubernetes's ValidatingWebhookConfiguration
// with each webhook's Service replaced by https://127.0.0.1:port (no
// Service routing here: no kube-proxy; the controller's certificate names
// 127.0.0.1 too). skein-controller fills in caBundle when it starts.
func webhookConfig(ctx context.Context, tb testing.TB, c client.Client, port int) {
	tb.Helper()
	for _, o := range cluster.Manifests(tb, filepath.Join("webhook", "validatingwebhookconfiguration.yaml")) {
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for i, h := range hooks {
			hm := h.(map[string]any)
			path, _, _ := unstructured.NestedString(hm, "clientConfig", "service", "path")
			hm["clientConfig"] = map[string]any{"url": fmt.Sprintf("https://127.0.0.1:%d%s", port, path)}
			hooks[i] = hm
		}
		if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
			tb.Fatal(err)
		}
		if err := c.Create(ctx, o); err != nil {
			tb.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// webhookReady waits until the controller has written caBundle into every
// webhook of the configuration and serves TLS on port.
func webhookReady(ctx context.Context, c client.Client, port int) error {
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: "skein-addresspool-validation"}, &cfg); err != nil {
		return err
	}
	for _, h := range cfg.Webhooks {
		if len(h.ClientConfig.CABundle) == 0 {
			return fmt.Errorf("webhook %s has no caBundle yet", h.Name)
		}
	}
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only: is it serving
	if err != nil {
		return err
	}
	return conn.Close()
}

// freePort is a TCP port of 127.0.0.1 free a moment ago.
func freePort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func poolCounts(ctx context.Context, c client.Client, blocks int64) error {
	p := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "default"}, p); err != nil {
		return err
	}
	if p.Status.BlocksAllocated != blocks {
		return fmt.Errorf("status.blocksAllocated %d, want %d", p.Status.BlocksAllocated, blocks)
	}
	return nil
}

func waitFor(tb testing.TB, what string, limit time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// apiMetrics reads the API server's /metrics as the admin.
func apiMetrics(ctx context.Context, env *kube.Env) (string, error) {
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return "", err
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("read the API server's metrics: %w", err)
	}
	return string(body), nil
}

// sample is one line of the Prometheus text format.
type sample struct {
	labels map[string]string
	value  float64
}

// samples returns the samples of metric name in text.
func samples(text, name string) []sample {
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		rest, ok := strings.CutPrefix(l, name)
		if !ok || rest == "" || rest[0] != '{' && rest[0] != ' ' {
			continue
		}
		s := sample{labels: map[string]string{}}
		if rest[0] == '{' {
			labels, after, ok := strings.Cut(rest[1:], "}")
			if !ok {
				continue
			}
			for _, kv := range strings.Split(labels, ",") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					s.labels[k] = strings.Trim(v, `"`)
				}
			}
			rest = after
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// rejected429 sums apiserver_flowcontrol_rejected_requests_total (every
// priority level and reason), and by level.
func rejected429(text string) (total float64, byLevel map[string]float64) {
	byLevel = map[string]float64{}
	for _, s := range samples(text, "apiserver_flowcontrol_rejected_requests_total") {
		total += s.value
		byLevel[s.labels["priority_level"]] += s.value
	}
	return total, byLevel
}

// histogramQuantile estimates quantile q of the histogram metric name
// (its _bucket samples whose labels include match), summed over the
// other labels, as the upper bound of the bucket it falls in; and the
// count.
func histogramQuantile(text, name string, match map[string]string, q float64) (upper float64, count float64) {
	byLE := map[float64]float64{}
	for _, s := range samples(text, name+"_bucket") {
		ok := true
		for k, v := range match {
			ok = ok && s.labels[k] == v
		}
		if !ok {
			continue
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			continue
		}
		byLE[le] += s.value
	}
	les := slices.Sorted(maps.Keys(byLE))
	if len(les) == 0 {
		return 0, 0
	}
	count = byLE[les[len(les)-1]]
	for _, le := range les {
		if byLE[le] >= q*count {
			return le, count
		}
	}
	return les[len(les)-1], count
}

// rssMiB reads VmRSS of pid from /proc; 0 when it cannot.
func rssMiB(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// cpuSeconds is the CPU time (user + system) pid has used; 0 when it
// cannot be read.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command (in parentheses, which may hold spaces).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ, 100 on Linux
}

// loadAverage is /proc/loadavg's one-minute figure.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// findPID finds the process named name whose command line mentions dir
// (test/kube's processes take their data and certificates from it).
func findPID(name, dir string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cl), "\x00")
		if filepath.Base(args[0]) == name && strings.Contains(string(cl), dir) {
			return pid
		}
	}
	return 0
}

package grafana

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/egress/router"
	"github.com/skeinnet/skein/internal/webhook"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
)

// exported is what a daemon's /metrics served: metric name (as a query
// names it: a histogram's _bucket, _sum and _count) → its label names.
type exported map[string]map[string]bool

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"job", "instance"}

// synthetic are the series Prometheus makes of a scrape itself.
var synthetic = []string{"up", "scrape_duration_seconds"}

// scrape reads url's exposition into ex.
func (ex exported) scrape(t *testing.T, c *http.Client, url string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	for name, f := range fams {
		ls := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = true
			}
		}
		add := func(name string, extra ...string) {
			if ex[name] == nil {
				ex[name] = map[string]bool{}
			}
			maps.Copy(ex[name], ls)
			for _, l := range extra {
				ex[name][l] = true
			}
		}
		switch f.GetType().String() {
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			add(name+"_bucket", "le")
			add(name + "_sum")
			add(name + "_count")
		case "SUMMARY":
			add(name, "quantile")
			add(name + "_sum")
			add(name + "_count")
		default:
			add(name)
		}
	}
}

// check fails the test for every metric of file's queries that ex lacks,
// and every label a query relies on that none of its metrics has.
func (ex exported) check(t *testing.T, file, daemon string) {
	t.Helper()
	d := readDashboard(t, file)
	for _, q := range queries(t, d) {
		us, err := uses(q.where, q.expr)
		if err != nil {
			t.Errorf("%s: %s: %v", file, q.where, err)
			continue
		}
		// Labels may come from any metric of the query (a join).
		have := map[string]bool{}
		for _, u := range us {
			maps.Copy(have, ex[u.metric])
		}
		for _, u := range us {
			if slices.Contains(synthetic, u.metric) {
				continue
			}
			if ex[u.metric] == nil {
				t.Errorf("%s: panel %s: metric %s is not exported by %s", file, q.where, u.metric, daemon)
				continue
			}
			for _, l := range u.labels {
				if !have[l] && !slices.Contains(targetLabels, l) {
					t.Errorf("%s: panel %s: label %q: %s has none (labels %v)", file, q.where, l, u.metric, slices.Sorted(maps.Keys(ex[u.metric])))
				}
			}
		}
	}
}

// TestDashboardMetricsExported runs the daemons and checks every metric
// the dashboards name against what they serve on /metrics, after work
// that makes their histograms and counters appear:
//
//   - skeind: the real binary in Kubernetes mode (test/kubenode, against a
//     real kube-apiserver), scraped after CNI ADD, CHECK and DEL, after
//     the failed ADD of a pod naming an Egress (no fou here: that times
//     an apply of the egress data plane), and after the deletion of a
//     block in use behind its back (skein_blocks_lost_total appears only
//     then);
//   - skein-controller: the real binary with its webhook on, scraped after
//     one AdmissionReview the webhook refuses, an Egress it reconciled
//     and a BlockRequest of a missing node its GC deleted;
//   - skein-egress: this host's kernel has no fou, so the binary cannot
//     run here; its agent (internal/egress/router, what the binary wires)
//     runs in this process with a fake data plane against the same API
//     server, and its real Handler — the binary's /metrics — is scraped.
func TestDashboardMetricsExported(t *testing.T) {
	harness.RequireRoot(t)
	webhookAddr := kubenode.LoopbackAddr(t)
	_, port, _ := strings.Cut(webhookAddr, ":")
	topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 1})
	cl := kubenode.StartCluster(t, kubenode.ClusterOptions{Topology: topo, ControllerArgs: []string{
		"--webhook-port", port, "--webhook-bind-address", "127.0.0.1", "--webhook-namespace", "kube-system"}})
	n := cl.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// skeind: ADD two pods, CHECK one, DEL the other.
	p1 := n.MustAddPod(t, "default", "p1")
	p2 := n.MustAddPod(t, "default", "p2")
	if err := n.D.CNI().CheckNetworkList(ctx, n.ConfList(t), p1.RT); err != nil {
		t.Fatalf("CHECK p1: %v", err)
	}
	if err := p2.Del(t); err != nil {
		t.Fatal(err)
	}

	// skein-egress: an Egress with one client pod, served by an agent
	// with a fake data plane.
	eg := &skeinv1.Egress{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nat"},
		Spec: skeinv1.EgressSpec{Destinations: []string{"0.0.0.0/0"}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "client",
		Annotations: map[string]string{skeinv1.AnnotationEgressPrefix + "default": "nat"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	for _, o := range []client.Object{eg, pod} {
		if err := cl.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	pod.Status.Phase, pod.Status.PodIPs = corev1.PodRunning, []corev1.PodIP{{IP: "10.9.0.2"}}
	if err := cl.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	agent, err := router.New(router.Options{Config: cl.Kube.Config, Namespace: "default", Name: "nat",
		Open:      func(router.DataplaneConfig) (router.Dataplane, error) { return fakeDP{}, nil },
		Dataplane: router.DataplaneConfig{Local4: netip.MustParseAddr("10.9.0.100")}})
	if err != nil {
		t.Fatal(err)
	}
	actx, astop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx) }()
	defer func() { astop(); <-done }()
	egressSrv := httptest.NewServer(agent.Handler())
	defer egressSrv.Close()
	kubenode.Eventually(t, kubenode.Wait, "the egress agent ready", func() string {
		if !agent.Ready() {
			return "not ready"
		}
		return ""
	})

	// skein-controller: one AdmissionReview through its webhook (once its
	// certificate is loaded), and the Egress above reconciled.
	tlsClient := &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	kubenode.Eventually(t, kubenode.Wait, "an AdmissionReview answered by the webhook", func() string {
		resp, err := tlsClient.Post("https://"+webhookAddr+webhook.Path, "application/json", bytes.NewReader(admissionReview))
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"allowed":false`) {
			return fmt.Sprintf("%s: %s", resp.Status, b)
		}
		return ""
	})
	kubenode.Eventually(t, kubenode.Wait, "the Egress's Service", func() string {
		if err := cl.Client.Get(ctx, client.ObjectKeyFromObject(eg), &corev1.Service{}); err != nil {
			return err.Error()
		}
		return ""
	})

	// skeind: the ADD of a pod naming the Egress fails on this host (its
	// kernel has no fou: TestKubeEgressAddFails), which times an apply
	// of the egress data plane and counts a request with an error code.
	ep := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "egress-client",
		Annotations: map[string]string{skeinv1.AnnotationEgressPrefix + "default": "nat"}},
		Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
	if err := cl.Client.Create(ctx, ep); err != nil {
		t.Fatal(err)
	}
	if _, err := n.AddPod(t, "default", "egress-client"); err == nil {
		t.Log("the ADD of a pod naming an Egress succeeded: this kernel has fou")
	}

	// skein-controller: a BlockRequest of the retired protocol for a node
	// that does not exist, deleted at once by the node GC
	// (skein_gc_deleted_total appears only then).
	br := &skeinv1.BlockRequest{ObjectMeta: metav1.ObjectMeta{Name: "gone-node-default"},
		Spec: skeinv1.BlockRequestSpec{NodeName: "gone-node", PoolName: skeinv1.DefaultPool}}
	if err := cl.Client.Create(ctx, br); err != nil {
		t.Fatal(err)
	}
	kubenode.Eventually(t, kubenode.Wait, "skein_gc_deleted_total in the controller's metrics", func() string {
		if cl.Controller.Sample(t, `skein_gc_deleted_total{kind="BlockRequest"}`) == "" {
			return "absent"
		}
		return ""
	})

	// skeind: a block of p1's deleted behind the node's back.
	b := cl.BlockOf(t, p1.Addrs[0])
	if b == nil {
		t.Fatalf("no AddressBlock holds p1's %v", p1.Addrs[0])
	}
	if err := cl.Client.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	kubenode.Eventually(t, kubenode.Wait, "skein_blocks_lost_total in skeind's metrics", func() string {
		if n.Sample(t, `skein_blocks_lost_total{pool="default"}`) == "" {
			return "absent"
		}
		return ""
	})

	skeind, controller, egress := exported{}, exported{}, exported{}
	skeind.scrape(t, http.DefaultClient, n.Metrics)
	controller.scrape(t, http.DefaultClient, cl.Controller.Metrics)
	egress.scrape(t, http.DefaultClient, egressSrv.URL+"/metrics")
	skeind.check(t, "skeind.json", "skeind")
	controller.check(t, "skein-controller.json", "skein-controller")
	egress.check(t, "skein-egress.json", "skein-egress")
	if t.Failed() {
		for name, ex := range map[string]exported{"skeind": skeind, "skein-controller": controller, "skein-egress": egress} {
			t.Logf("%s exports %v", name, slices.Sorted(maps.Keys(ex)))
		}
	}
}

// admissionReview asks about an AddressPool the webhook refuses (a
// subnet that is not one).
var admissionReview = []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
"uid":"0d5c6e2a-0000-4000-8000-000000000001",
"kind":{"group":"skein.dev","version":"v1alpha1","kind":"AddressPool"},
"resource":{"group":"skein.dev","version":"v1alpha1","resource":"addresspools"},
"name":"bad","operation":"CREATE","userInfo":{"username":"test"},
"object":{"apiVersion":"skein.dev/v1alpha1","kind":"AddressPool","metadata":{"name":"bad"},
"spec":{"subnets":[{"ipv4":"not-a-subnet"}]}}}}`)

// fakeDP is a data plane that has every figure the agent reports.
type fakeDP struct{}

func (fakeDP) SyncPeers([]netip.Addr) error          { return nil }
func (fakeDP) SyncDestinations([]netip.Prefix) error { return nil }
func (fakeDP) Stats() (router.Stats, error) {
	return router.Stats{Tunnels: 1, Peers: 1, ConntrackEntries: 2, Packets: 3, Bytes: 4, NATConnections: 5}, nil
}
func (fakeDP) Close() error { return nil }

package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// fakeDP records what the agent asks of a data plane.
type fakeDP struct {
	cfg DataplaneConfig

	mu      sync.Mutex
	syncs   [][]netip.Addr
	dests   [][]netip.Prefix // SyncDestinations calls
	failing int              // SyncPeers calls still to refuse
	closed  bool
	stats   Stats
}

func (f *fakeDP) SyncPeers(peers []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("sync after close")
	}
	if f.failing > 0 {
		f.failing--
		return errors.New("refused on purpose")
	}
	f.syncs = append(f.syncs, slices.Clone(peers))
	f.stats.Peers, f.stats.Tunnels = len(peers), len(peers)
	return nil
}

func (f *fakeDP) SyncDestinations(dsts []netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("sync after close")
	}
	f.dests = append(f.dests, slices.Clone(dsts))
	return nil
}

// lastDests is the last destination list the data plane was given, as
// strings, and whether it was given one.
func (f *fakeDP) lastDests() ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.dests) == 0 {
		return nil, false
	}
	var out []string
	for _, d := range f.dests[len(f.dests)-1] {
		out = append(out, d.String())
	}
	return out, true
}

func (f *fakeDP) Stats() (Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats, nil
}

func (f *fakeDP) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

func (f *fakeDP) last() ([]netip.Addr, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.syncs) == 0 {
		return nil, 0
	}
	return f.syncs[len(f.syncs)-1], len(f.syncs)
}

// opener hands out fakeDPs and keeps them.
type opener struct {
	mu      sync.Mutex
	opened  []*fakeDP
	failing int // SyncPeers failures of the next data plane
}

func (o *opener) open(cfg DataplaneConfig) (Dataplane, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f := &fakeDP{cfg: cfg, failing: o.failing}
	o.failing = 0
	o.opened = append(o.opened, f)
	return f, nil
}

func (o *opener) all() []*fakeDP {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.opened)
}

func (o *opener) current() *fakeDP {
	all := o.all()
	if len(all) == 0 {
		return nil
	}
	return all[len(all)-1]
}

const (
	egNS   = "gateways"
	egName = "nat"
)

type rig struct {
	env   *kube.Env
	c     client.Client
	op    *opener
	agent *Agent
	srv   *httptest.Server
	done  chan error
	stop  context.CancelFunc
}

// start runs the API server with namespaces for the Egress and for
// clients, and an Agent for gateways/nat on a recording data plane.
func start(t *testing.T, failing int) *rig {
	t.Helper()
	return startResync(t, failing, time.Hour)
}

func startResync(t *testing.T, failing int, resync time.Duration) *rig {
	t.Helper()
	return startWith(t, failing, resync, kube.Options{}, func(env *kube.Env, _ client.Client) *rest.Config { return env.Config })
}

// startWith is start with the API server's options and the agent's
// configuration (made once the namespaces exist) chosen.
func startWith(t *testing.T, failing int, resync time.Duration, opts kube.Options, as func(*kube.Env, client.Client) *rest.Config) *rig {
	t.Helper()
	env := kube.Start(t, opts)
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{egNS, "apps", "web", "stranger"} {
		if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	r := &rig{env: env, c: c, op: &opener{failing: failing}, done: make(chan error, 1)}
	r.agent, err = New(Options{
		Config: as(env, c), Namespace: egNS, Name: egName, Open: r.op.open,
		Dataplane:  DataplaneConfig{Port: 5555, Local4: netip.MustParseAddr("10.9.0.1"), Local6: netip.MustParseAddr("fd09::1"), OutInterface: "eth0"},
		Coalesce:   10 * time.Millisecond,
		Resync:     resync,
		MinBackoff: 20 * time.Millisecond,
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewServer(r.agent.Handler())
	t.Cleanup(r.srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.done <- r.agent.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return 30 s after its context ended")
		}
	})
	return r
}

func (r *rig) createEgress(t *testing.T, mode string) *skeinv1.Egress {
	t.Helper()
	eg := &skeinv1.Egress{
		ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: egName},
		// Clients in "apps" and "web"; "stranger" is not served.
		Spec: skeinv1.EgressSpec{Destinations: []string{"0.0.0.0/0"}, FoUSourcePort: mode, ClientNamespaces: []string{"apps", "web"}},
	}
	if err := r.c.Create(context.Background(), eg); err != nil {
		t.Fatal(err)
	}
	return eg
}

// createPod makes a pod and then writes its status as a kubelet would.
func (r *rig) createPod(t *testing.T, ns, name string, ann map[string]string, hostNet bool, phase corev1.PodPhase, ips ...string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec:       corev1.PodSpec{HostNetwork: hostNet, Containers: []corev1.Container{{Name: "c", Image: "example/app"}}},
	}
	if err := r.c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	r.setStatus(t, p, phase, ips...)
	return p
}

func (r *rig) setStatus(t *testing.T, p *corev1.Pod, phase corev1.PodPhase, ips ...string) {
	t.Helper()
	p.Status.Phase = phase
	p.Status.PodIPs = nil
	p.Status.PodIP = ""
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	if err := r.c.Status().Update(context.Background(), p); err != nil {
		t.Fatalf("pod %s/%s status: %v", p.Namespace, p.Name, err)
	}
}

// wantPeers waits until the current data plane's last sync is want.
func (r *rig) wantPeers(t *testing.T, what string, want ...string) {
	t.Helper()
	w := addrs(want...)
	eventually(t, what, func() string {
		dp := r.op.current()
		if dp == nil {
			return "no data plane opened"
		}
		got, n := dp.last()
		if n == 0 || !slices.Equal(got, w) {
			return fmt.Sprintf("last of %d syncs %v, want %v", n, got, w)
		}
		return ""
	})
}

func eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s after 30 s", what, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *rig) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(r.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of the sample named name ("" when absent).
func (r *rig) metric(t *testing.T, name string) string {
	t.Helper()
	_, body := r.get(t, "/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// TestPeersFollowPods: the data plane is synced with exactly the
// addresses of the Egress's client pods, across namespaces, as pods come,
// change and go.
func TestPeersFollowPods(t *testing.T) {
	r := start(t, 0)
	ctx := context.Background()
	use := func(v string) map[string]string { return map[string]string{skeinv1.AnnotationEgressPrefix + egNS: v} }

	// Pods before the Egress exists: nothing is opened, not ready.
	a := r.createPod(t, "apps", "a", use("nat"), false, corev1.PodRunning, "10.1.0.1", "fd01::1")
	eventually(t, "waiting for the Egress", func() string {
		if code, body := r.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for Egress gateways/nat") {
			return fmt.Sprintf("readyz %d %q, want 503 naming the Egress", code, body)
		}
		return ""
	})
	time.Sleep(200 * time.Millisecond)
	if len(r.op.all()) != 0 {
		t.Fatal("a data plane was opened before the Egress existed")
	}
	if code, _ := r.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("healthz: %d", code)
	}
	r.createEgress(t, skeinv1.FoUSourcePortFixed)
	r.wantPeers(t, "first client", "10.1.0.1", "fd01::1")
	if code, _ := r.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("readyz after the first sync: %d", code)
	}
	if cfg := r.op.current().cfg; cfg.SourcePortAuto || cfg.Port != 5555 || cfg.Local4 != netip.MustParseAddr("10.9.0.1") {
		t.Errorf("data plane opened with %+v, want port 5555, fixed source port, local 10.9.0.1", cfg)
	}

	// Every way of not being a client, in several namespaces.
	b := r.createPod(t, "web", "b", use(" other ,nat"), false, corev1.PodRunning, "10.1.0.2")
	r.createPod(t, "web", "wrong-key", map[string]string{skeinv1.AnnotationEgressPrefix + "web": "nat"}, false, corev1.PodRunning, "10.1.0.3")
	c := r.createPod(t, "apps", "other-egress", use("other"), false, corev1.PodRunning, "10.1.0.4")
	r.createPod(t, "apps", "host", use("nat"), true, corev1.PodRunning, "192.168.0.10")
	r.createPod(t, "apps", "done", use("nat"), false, corev1.PodSucceeded, "10.1.0.5")
	r.createPod(t, "apps", "failed", use("nat"), false, corev1.PodFailed, "10.1.0.6")
	d := r.createPod(t, egNS, "no-ip", use("nat"), false, corev1.PodPending)
	r.createPod(t, "web", "prefix", use("nat2"), false, corev1.PodRunning, "10.1.0.7")
	// Annotated, but of a namespace the Egress does not serve.
	r.createPod(t, "stranger", "intruder", use("nat"), false, corev1.PodRunning, "10.1.0.9")
	r.wantPeers(t, "clients among non-clients", "10.1.0.1", "10.1.0.2", "fd01::1")

	// The pod without addresses gets one.
	r.setStatus(t, d, corev1.PodRunning, "10.1.0.8")
	r.wantPeers(t, "a pod's address arrives", "10.1.0.1", "10.1.0.2", "10.1.0.8", "fd01::1")

	// Annotation edits: one pod starts using the Egress, one stops.
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(c), c); err != nil {
		t.Fatal(err)
	}
	c.Annotations = use("other, nat")
	if err := r.c.Update(ctx, c); err != nil {
		t.Fatal(err)
	}
	r.wantPeers(t, "annotation added", "10.1.0.1", "10.1.0.2", "10.1.0.4", "10.1.0.8", "fd01::1")
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
		t.Fatal(err)
	}
	delete(a.Annotations, skeinv1.AnnotationEgressPrefix+egNS)
	if err := r.c.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	r.wantPeers(t, "annotation removed", "10.1.0.2", "10.1.0.4", "10.1.0.8")

	// A pod finishing, and a pod deleted.
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(d), d); err != nil {
		t.Fatal(err)
	}
	r.setStatus(t, d, corev1.PodFailed, "10.1.0.8")
	if err := r.c.Delete(ctx, b, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	r.wantPeers(t, "finished and deleted", "10.1.0.4")

	// Never was any non-client address synced.
	bad := addrs("10.1.0.3", "192.168.0.10", "10.1.0.5", "10.1.0.6", "10.1.0.7")
	for _, dp := range r.op.all() {
		dp.mu.Lock()
		for _, s := range dp.syncs {
			for _, p := range s {
				if slices.Contains(bad, p) {
					t.Errorf("a sync held %v, not a client: %v", p, s)
				}
			}
		}
		dp.mu.Unlock()
	}

	// Metrics: clients from the pod set, the rest from the data plane.
	eventually(t, "metrics", func() string {
		got := map[string]string{}
		for _, n := range []string{"skein_egress_clients", "skein_egress_tunnels", "skein_egress_peers",
			"skein_egress_conntrack_entries", "skein_egress_packets_total", "skein_egress_bytes_total", "skein_egress_sync_errors_total"} {
			got[n] = r.metric(t, n)
		}
		want := map[string]string{"skein_egress_clients": "1", "skein_egress_tunnels": "1", "skein_egress_peers": "1",
			"skein_egress_conntrack_entries": "0", "skein_egress_packets_total": "0", "skein_egress_bytes_total": "0",
			"skein_egress_sync_errors_total": "0"}
		for k, v := range want {
			if got[k] != v {
				return fmt.Sprintf("metrics %v, want %v", got, want)
			}
		}
		return ""
	})
	dp := r.op.current()
	dp.mu.Lock()
	dp.stats.Packets, dp.stats.Bytes, dp.stats.ConntrackEntries, dp.stats.NATConnections = 12, 3400, 5, 2
	dp.mu.Unlock()
	if p, by, ct, nat := r.metric(t, "skein_egress_packets_total"), r.metric(t, "skein_egress_bytes_total"),
		r.metric(t, "skein_egress_conntrack_entries"), r.metric(t, "skein_egress_nat_connections_total"); p != "12" || by != "3400" || ct != "5" || nat != "2" {
		t.Errorf("packets %q bytes %q conntrack %q nat %q, want the data plane's 12, 3400, 5, 2 at scrape time", p, by, ct, nat)
	}
}

// TestSourcePortFollowsEgress: a change of the Egress's fouSourcePort
// reopens the data plane in the new mode with the whole set; SIGTERM's
// path (the context ending) closes it.
func TestSourcePortFollowsEgress(t *testing.T) {
	r := start(t, 0)
	ctx := context.Background()
	r.createPod(t, "apps", "a", map[string]string{skeinv1.AnnotationEgressPrefix + egNS: "nat"}, false, corev1.PodRunning, "10.1.0.1")
	eg := r.createEgress(t, skeinv1.FoUSourcePortFixed)
	r.wantPeers(t, "fixed", "10.1.0.1")
	first := r.op.current()

	eg.Spec.FoUSourcePort = skeinv1.FoUSourcePortAuto
	if err := r.c.Update(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reopened", func() string {
		if n := len(r.op.all()); n != 2 {
			return fmt.Sprintf("%d data planes opened", n)
		}
		return ""
	})
	r.wantPeers(t, "auto", "10.1.0.1")
	if cur := r.op.current(); !cur.cfg.SourcePortAuto {
		t.Errorf("reopened with %+v, want SourcePortAuto", cur.cfg)
	}
	first.mu.Lock()
	if !first.closed {
		t.Error("the fixed-port data plane was not closed before the new one was opened")
	}
	first.mu.Unlock()

	// A change that is not the mode reopens nothing.
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(eg), eg); err != nil {
		t.Fatal(err)
	}
	eg.Spec.Destinations = []string{"192.0.2.0/24"}
	if err := r.c.Update(ctx, eg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(r.op.all()); n != 2 {
		t.Errorf("%d data planes after a destinations change, want still 2", n)
	}

	r.stop()
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.done <- nil // for the cleanup
	cur := r.op.current()
	cur.mu.Lock()
	defer cur.mu.Unlock()
	if !cur.closed {
		t.Error("the data plane is still open after Run returned")
	}
}

// TestDestinationsFollowEgress: the data plane forwards to the Egress's
// destinations only: it gets them before its first peers, again when
// they change, and a data plane reopened (fouSourcePort) gets them too.
func TestDestinationsFollowEgress(t *testing.T) {
	r := start(t, 0)
	ctx := context.Background()
	r.createPod(t, "apps", "a", map[string]string{skeinv1.AnnotationEgressPrefix + egNS: "nat"}, false, corev1.PodRunning, "10.1.0.1")
	eg := r.createEgress(t, skeinv1.FoUSourcePortFixed)
	r.wantPeers(t, "first sync", "10.1.0.1")
	wantDests := func(what string, want ...string) {
		t.Helper()
		eventually(t, what, func() string {
			dp := r.op.current()
			got, ok := dp.lastDests()
			if !ok || !slices.Equal(got, want) {
				return fmt.Sprintf("destinations %v (given: %v), want %v", got, ok, want)
			}
			return ""
		})
	}
	wantDests("at the start", "0.0.0.0/0")
	first := r.op.current()
	first.mu.Lock()
	if len(first.dests) == 0 || len(first.syncs) == 0 {
		t.Errorf("first data plane: %d destination and %d peer syncs", len(first.dests), len(first.syncs))
	}
	first.mu.Unlock()

	eg.Spec.Destinations = []string{"192.0.2.0/24", "2001:db8::/32"}
	if err := r.c.Update(ctx, eg); err != nil {
		t.Fatal(err)
	}
	wantDests("after a change", "192.0.2.0/24", "2001:db8::/32")
	if n := len(r.op.all()); n != 1 {
		t.Errorf("%d data planes after a destinations change, want 1", n)
	}

	if err := r.c.Get(ctx, client.ObjectKeyFromObject(eg), eg); err != nil {
		t.Fatal(err)
	}
	eg.Spec.FoUSourcePort = skeinv1.FoUSourcePortAuto
	if err := r.c.Update(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reopened", func() string {
		if n := len(r.op.all()); n != 2 {
			return fmt.Sprintf("%d data planes opened", n)
		}
		return ""
	})
	wantDests("after reopening", "192.0.2.0/24", "2001:db8::/32")
}

// TestNarrowAccount: with only the grants skein-controller gives a router
// account (its Egress by name; pods of the served namespaces, here
// gateways, apps and web, not stranger), the agent lists and watches what
// it needs (a cluster-wide pod list would be refused), and follows
// spec.clientNamespaces: a namespace no longer served is no longer
// watched and its pods no longer peers; a newly served one is.
func TestNarrowAccount(t *testing.T) {
	const user = "router"
	r := startWith(t, 0, time.Hour, kube.Options{Users: []kube.User{{Name: user}}}, func(env *kube.Env, c client.Client) *rest.Config {
		subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
		objs := []client.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "skein-egress"}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: "skein-egress"}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"skein.dev"}, Resources: []string{"egresses"}, ResourceNames: []string{egName}, Verbs: []string{"get", "list", "watch"}}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: "skein-egress"},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "skein-egress"}, Subjects: subject},
		}
		for _, ns := range []string{egNS, "apps", "web"} {
			objs = append(objs, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "skein-egress-" + egNS},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "skein-egress"}, Subjects: subject})
		}
		for _, o := range objs {
			if err := c.Create(context.Background(), o); err != nil {
				t.Fatal(err)
			}
		}
		return env.UserConfig(user)
	})
	use := map[string]string{skeinv1.AnnotationEgressPrefix + egNS: egName}
	r.createPod(t, "apps", "a", use, false, corev1.PodRunning, "10.1.0.1")
	r.createPod(t, "web", "w", use, false, corev1.PodRunning, "10.1.0.2")
	r.createPod(t, "stranger", "s", use, false, corev1.PodRunning, "10.1.0.9")
	eg := r.createEgress(t, skeinv1.FoUSourcePortFixed)
	r.wantPeers(t, "apps and web served", "10.1.0.1", "10.1.0.2")
	eventually(t, "ready", func() string {
		if !r.agent.Ready() {
			return "not ready"
		}
		return ""
	})

	eg.Spec.ClientNamespaces = []string{"web"}
	if err := r.c.Update(context.Background(), eg); err != nil {
		t.Fatal(err)
	}
	r.wantPeers(t, "apps no longer served", "10.1.0.2")
	r.agent.pods.mu.Lock()
	_, watching := r.agent.pods.byNS["apps"]
	r.agent.pods.mu.Unlock()
	if watching {
		t.Error("the pods of apps are still watched")
	}
	r.createPod(t, "web", "w2", use, false, corev1.PodRunning, "10.1.0.3")
	r.wantPeers(t, "a new client in web", "10.1.0.2", "10.1.0.3")
}

// TestSyncErrorsRetried: a refused sync is counted, retried, and the
// router turns ready only once one succeeds.
func TestSyncErrorsRetried(t *testing.T) {
	r := start(t, 3)
	r.createPod(t, "apps", "a", map[string]string{skeinv1.AnnotationEgressPrefix + egNS: "nat"}, false, corev1.PodRunning, "10.1.0.1")
	r.createEgress(t, "")
	eventually(t, "a refused sync", func() string {
		if v := r.metric(t, "skein_egress_sync_errors_total"); v == "" || v == "0" {
			return "sync errors " + v
		}
		return ""
	})
	if !r.agent.Ready() {
		if code, body := r.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "refused on purpose") {
			t.Errorf("readyz after a refused sync: %d %q, want 503 with the error", code, body)
		}
	}
	r.wantPeers(t, "retried", "10.1.0.1")
	if v := r.metric(t, "skein_egress_sync_errors_total"); v != "3" {
		t.Errorf("sync errors %q, want 3", v)
	}
	if code, _ := r.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("readyz after the retry: %d", code)
	}
}

func TestFamiliesWithoutLocalAddress(t *testing.T) {
	a := &Agent{o: Options{Dataplane: DataplaneConfig{Local4: netip.MustParseAddr("10.0.0.1")}}}
	if got := a.families(addrs("10.0.0.2", "fd00::2")); !slices.Equal(got, addrs("10.0.0.2")) {
		t.Errorf("v4-only router keeps %v, want only the IPv4 peer", got)
	}
	a.o.Dataplane = DataplaneConfig{Local6: netip.MustParseAddr("fd00::1")}
	if got := a.families(addrs("10.0.0.2", "fd00::2")); !slices.Equal(got, addrs("fd00::2")) {
		t.Errorf("v6-only router keeps %v, want only the IPv6 peer", got)
	}
}

func TestNewRefuses(t *testing.T) {
	ok := Options{Config: &rest.Config{Host: "https://x"}, Namespace: "n", Name: "e", Open: (&opener{}).open,
		Dataplane: DataplaneConfig{Local4: netip.MustParseAddr("10.0.0.1")}}
	if _, err := New(ok); err != nil {
		t.Fatalf("good options: %v", err)
	}
	for name, mod := range map[string]func(*Options){
		"no name":      func(o *Options) { o.Name = "" },
		"no namespace": func(o *Options) { o.Namespace = "" },
		"no opener":    func(o *Options) { o.Open = nil },
		"no config":    func(o *Options) { o.Config = nil },
		"no address":   func(o *Options) { o.Dataplane.Local4 = netip.Addr{} },
	} {
		o := ok
		mod(&o)
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// With nothing changing, the whole set is synced again every Resync: a
// data plane disturbed from outside is repaired.
func TestPeriodicResync(t *testing.T) {
	r := startResync(t, 0, 200*time.Millisecond)
	r.createPod(t, "apps", "a", map[string]string{skeinv1.AnnotationEgressPrefix + egNS: "nat"}, false, corev1.PodRunning, "10.1.0.1")
	r.createEgress(t, skeinv1.FoUSourcePortFixed)
	r.wantPeers(t, "first sync", "10.1.0.1")
	_, first := r.op.current().last()
	eventually(t, "resyncs", func() string {
		got, n := r.op.current().last()
		if n < first+3 || !slices.Equal(got, addrs("10.1.0.1")) {
			return fmt.Sprintf("%d syncs (first %d), last %v", n, first, got)
		}
		return ""
	})
}

// TestRunStopsInformersOnError: when Run ends with an error (here a data
// plane that cannot be opened) while its context lives on, it stops the
// informers it started: no goroutine and no watch outlives it.
func TestRunStopsInformersOnError(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ns := range []string{egNS, "apps"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	a, err := New(Options{
		Config: env.Config, Namespace: egNS, Name: egName,
		Open:      func(DataplaneConfig) (Dataplane, error) { return nil, errors.New("no data plane on purpose") },
		Dataplane: DataplaneConfig{Local4: netip.MustParseAddr("10.9.0.1")},
		Coalesce:  10 * time.Millisecond,
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	r := &rig{c: c}
	r.createEgress(t, skeinv1.FoUSourcePortFixed)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no data plane on purpose") {
			t.Fatalf("Run: %v, want the open error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end on a data plane that cannot be opened")
	}
	// A client appearing now must not reach the stopped agent's pod set.
	r.createPod(t, "apps", "late", map[string]string{skeinv1.AnnotationEgressPrefix + egNS: egName}, false, corev1.PodRunning, "10.1.0.1")
	time.Sleep(time.Second)
	if got, pods := a.peers.snapshot(func(string) bool { return true }); len(got) != 0 || pods != 0 {
		t.Errorf("after Run returned, its pod informer still ran: peers %v of %d pods", got, pods)
	}
}

// TestEgressDeletedWhileRunning: the Egress going (its router pods are
// stopped by the garbage collector soon after) neither closes the data
// plane nor stops it following clients: connections through it live on
// until SIGTERM.
func TestEgressDeletedWhileRunning(t *testing.T) {
	r := start(t, 0)
	use := map[string]string{skeinv1.AnnotationEgressPrefix + egNS: "nat"}
	r.createPod(t, "apps", "a", use, false, corev1.PodRunning, "10.1.0.1")
	eg := r.createEgress(t, skeinv1.FoUSourcePortFixed)
	r.wantPeers(t, "first sync", "10.1.0.1")
	if err := r.c.Delete(context.Background(), eg); err != nil {
		t.Fatal(err)
	}
	r.createPod(t, "apps", "b", use, false, corev1.PodRunning, "10.1.0.2")
	r.wantPeers(t, "a client after the Egress went", "10.1.0.1", "10.1.0.2")
	if n := len(r.op.all()); n != 1 {
		t.Errorf("%d data planes opened, want the first one kept", n)
	}
	cur := r.op.current()
	cur.mu.Lock()
	closed := cur.closed
	cur.mu.Unlock()
	if closed || !r.agent.Ready() {
		t.Errorf("after the Egress went: data plane closed %v, ready %v; want open and ready", closed, r.agent.Ready())
	}
}

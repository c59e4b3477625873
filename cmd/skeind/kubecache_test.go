package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/podegress"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

// watches counts the watch requests a client has open, by resource and
// selector ("pods?fieldSelector=spec.nodeName=n1"): a watch is open from
// its request until its response body is closed.
type watches struct {
	mu   sync.Mutex
	open map[string]int
}

func (w *watches) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTrip(func(r *http.Request) (*http.Response, error) {
		q := r.URL.Query()
		if q.Get("watch") != "true" && q.Get("watch") != "1" {
			return rt.RoundTrip(r)
		}
		key := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		for _, s := range []string{"labelSelector", "fieldSelector"} {
			if v := q.Get(s); v != "" {
				key += "?" + s + "=" + v
			}
		}
		w.add(key, 1)
		resp, err := rt.RoundTrip(r)
		if err != nil {
			w.add(key, -1)
			return nil, err
		}
		var once sync.Once
		resp.Body = closer{resp.Body, func() { once.Do(func() { w.add(key, -1) }) }}
		return resp, nil
	})
}

func (w *watches) add(key string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open == nil {
		w.open = map[string]int{}
	}
	w.open[key] += n
	if w.open[key] == 0 {
		delete(w.open, key)
	}
}

// list is the open watches, one entry per watch, sorted.
func (w *watches) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k, n := range w.open {
		for range n {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// settle waits until the open watches have not changed for a second
// (informers open theirs right after their list), and returns them.
func (w *watches) settle(t *testing.T) []string {
	t.Helper()
	last, since := w.list(), time.Now()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		cur := w.list()
		if !slices.Equal(cur, last) {
			last, since = cur, time.Now()
			continue
		}
		if time.Since(since) > time.Second {
			return cur
		}
	}
	t.Fatalf("the open watches did not settle: %q", last)
	return nil
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type closer struct {
	io.ReadCloser
	after func()
}

func (c closer) Close() error {
	err := c.ReadCloser.Close()
	c.after()
	return err
}

// kubeFixture is an API server with what skeind n1 reads: the default
// pool, a namespace naming it, Nodes n1 and n2, a block of n2, and a pod
// on each node.
func kubeFixture(t *testing.T, users ...kube.User) (*kube.Env, client.Client) {
	t.Helper()
	harness.RequireRoot(t)
	env := kube.Start(t, kube.Options{Users: users})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, obj := range []client.Object{
		kubenode.DefaultPool.DeepCopy(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", Annotations: map[string]string{skeinv1.AnnotationPool: skeinv1.DefaultPool}}},
		&skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName(skeinv1.DefaultPool, 1),
			Labels: map[string]string{skeinv1.LabelPool: skeinv1.DefaultPool, skeinv1.LabelNode: "n2"}},
			NodeName: "n2", Index: 1, IPv4: ptr.To("10.130.0.8/29")},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "on-n1"},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "on-n2"},
			Spec: corev1.PodSpec{NodeName: "n2", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	kubenode.CreateNode(t, c, "n1", netip.MustParseAddr("192.0.2.1"))
	kubenode.CreateNode(t, c, "n2", netip.MustParseAddr("192.0.2.2"))
	return env, c
}

// TestKubeWatches: a skeind in Kubernetes mode (store, routing in export
// mode and the egress client, wired as main does) opens one watch per kind
// it reads — 7, scoped where a node needs only its own objects — instead
// of one per kind per part (10: three of AddressPools, two of
// AddressBlocks), and closes them all when it stops. The one cache serves
// every part: the store's pools, routing's remote blocks, this node's pods
// only, and no managedFields.
func TestKubeWatches(t *testing.T) {
	env, c := kubeFixture(t)
	kc, err := env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Before: each part with a cache of its own.
	var before watches
	rc := rest.CopyConfig(env.Config)
	rc.Wrap(before.wrap)
	local, err := store.OpenBolt(filepath.Join(t.TempDir(), "skein.db"), store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := kubestore.New(ctx, kubestore.Options{Config: rc, Node: "n1", Local: local})
	if err != nil {
		t.Fatal(err)
	}
	w, err := routing.NewWatcher(ctx, routing.WatchOptions{Config: rc, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	pe, err := podegress.New(ctx, podegress.Options{Config: rc, Node: "n1", Applier: podegress.ApplierFunc(
		func(string, egress.ClientConfig) error { return nil }), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	separate := before.settle(t)
	pe.Close()
	w.Close()
	st.Close()

	// Now: skeind's wiring.
	var now watches
	kf := kubeFlags{store: "kubernetes", kubeconfig: kc, egress: true, wrap: now.wrap}
	dir := t.TempDir()
	cfg := daemon.Config{Node: "n1", StateDir: dir, Socket: filepath.Join(dir, "skeind.sock")} // the CNI records' file goes beside the socket
	cfg.Dataplane.NodeNetNS = harness.NewNS(t, "kw").Path()
	kn, err := kf.openKube(ctx, &cfg, routing.ModeExport, log)
	if err != nil {
		t.Fatal(err)
	}
	shared := now.settle(t)
	t.Logf("watches of one skeind: %d with a cache per part %q, %d with the shared cache %q", len(separate), separate, len(shared), shared)
	want := []string{
		"addressblocks", "addresspools", "egresses", "namespaces", "nodes",
		"pods?fieldSelector=spec.nodeName=n1", "services?labelSelector=egress.skein.dev/name",
	}
	if !slices.Equal(shared, want) {
		t.Errorf("watches of skeind:\n  %q\nwant\n  %q", shared, want)
	}
	// The parts' own caches: three pool watches (routing derives the
	// blocks' slices from their pools) and two block watches.
	if len(separate) != 10 {
		t.Errorf("%d watches with a cache per part, want 10 (the test no longer measures what the parts watch on their own)", len(separate))
	}

	// Every part reads it.
	if _, err := cfg.Store.GetPool(ctx, skeinv1.DefaultPool); err != nil {
		t.Errorf("the store's pool: %v", err)
	}
	if p, ok, err := cfg.Store.(*kubestore.Store).PoolForNamespace(ctx, "app"); err != nil || !ok || p != skeinv1.DefaultPool {
		t.Errorf("the store's namespace pool: %q, %v, %v", p, ok, err)
	}
	snap, err := kn.routing.watcher.Snapshot(ctx)
	if err != nil || len(snap.Remotes) != 1 || snap.Remotes[0].Node != "n2" || len(snap.Remotes[0].NodeAddrs) != 1 {
		t.Errorf("routing's snapshot: %+v, %v; want n2's block via 192.0.2.2", snap.Remotes, err)
	}
	var pods corev1.PodList
	if err := kn.cache.List(ctx, &pods); err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "on-n1" {
		t.Errorf("cached pods: %d, %v; want on-n1 alone", len(pods.Items), err)
	}
	var pool skeinv1.AddressPool
	if err := c.Get(ctx, client.ObjectKey{Name: skeinv1.DefaultPool}, &pool); err != nil || len(pool.ManagedFields) == 0 {
		t.Fatalf("the API's pool has no managedFields (%v): nothing to check", err)
	}
	if err := kn.cache.Get(ctx, client.ObjectKey{Name: skeinv1.DefaultPool}, &pool); err != nil || len(pool.ManagedFields) != 0 {
		t.Errorf("the cached pool: %v, managedFields %d; want none", err, len(pool.ManagedFields))
	}

	cfg.Store.Close()
	kn.close()
	kubenode.Eventually(t, 10*time.Second, "watches closed", func() string {
		if open := now.list(); len(open) > 0 {
			return strings.Join(open, " ")
		}
		return ""
	})
}

// TestKubeCacheRBAC: a skeind that may not watch a kind fails after the
// sync timeout naming that kind, who reads it, the API server's refusal,
// and every permission it needs.
func TestKubeCacheRBAC(t *testing.T) {
	user := kube.User{Name: "skeind-test"}
	env, c := kubeFixture(t, user)
	ctx := context.Background()
	// Everything skeind reads but Nodes.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "skeind-test"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"skein.dev"}, Resources: []string{"addresspools", "addressblocks", "blockrequests", "egresses"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces", "pods", "services"}, Verbs: []string{"get", "list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "skeind-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user.Name}}}
	for _, obj := range []client.Object{role, binding} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := env.WriteKubeconfig(user.Name)
	if err != nil {
		t.Fatal(err)
	}
	kf := kubeFlags{store: "kubernetes", kubeconfig: kc, egress: true, syncTimeout: 3 * time.Second}
	dir := t.TempDir()
	cfg := daemon.Config{Node: "n1", StateDir: dir, Socket: filepath.Join(dir, "skeind.sock")} // the CNI records' file goes beside the socket
	cfg.Dataplane.NodeNetNS = harness.NewNS(t, "kw").Path()
	kn, err := kf.openKube(ctx, &cfg, routing.ModeExport, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		kn.close()
		t.Fatal("openKube without permission to watch Nodes: no error")
	}
	msg := err.Error()
	t.Logf("openKube: %v", err)
	for _, want := range []string{"did not sync within 3s", "nodes (read by routing)", `nodes is forbidden: User "skeind-test" cannot list resource "nodes"`,
		"needs get, list and watch of", "addresspools.skein.dev", "egresses.skein.dev", "pods", "skeind-rbac.yaml"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q", want)
		}
	}
	if strings.Contains(msg, "addressblocks.skein.dev (read by") {
		t.Errorf("the error names a kind that synced: %v", err)
	}
	if cfg.Store != nil {
		t.Error("a store was opened")
	}
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

func TestFlagCheck(t *testing.T) {
	good := flags{gcInterval: time.Minute, gcGrace: time.Minute, poolStatus: time.Second, qps: 100, burst: 200, leaderElect: true, leaseName: "x",
		leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}
	if err := good.check(); err != nil {
		t.Errorf("good flags: %v", err)
	}
	for name, mod := range map[string]func(*flags){
		"renew deadline past the lease": func(f *flags) { f.renewDeadline = 20 * time.Second },
		"no retry period":               func(f *flags) { f.retryPeriod = 0 },
		"no lease name":                 func(f *flags) { f.leaseName = "" },
		"zero gc interval":              func(f *flags) { f.gcInterval = 0 },
		"zero qps":                      func(f *flags) { f.qps = 0 },
		"zero node gc grace":            func(f *flags) { f.gcGrace = 0 },
		"zero pool status interval":     func(f *flags) { f.poolStatus = 0 },
	} {
		f := good
		mod(&f)
		if err := f.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// controllerUser is who the binaries run as, with only the permissions
// controller-rbac.yaml grants; namespace is skein's, with the Leases.
const (
	controllerUser = "skein-controller"
	namespace      = "skein-system"
)

func grantControllerRole(t *testing.T, c client.Client) {
	t.Helper()
	rule := func(group string, resources, verbs []string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, Verbs: verbs}
	}
	named := func(r rbacv1.PolicyRule, names ...string) rbacv1.PolicyRule {
		r.ResourceNames = names
		return r
	}
	read := []string{"get", "list", "watch"}
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: controllerUser}}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
			Rules: []rbacv1.PolicyRule{
				rule("skein.dev", []string{"addresspools"}, append(read, "update")),
				rule("skein.dev", []string{"addresspools/status"}, []string{"update"}),
				rule("skein.dev", []string{"addressblocks"}, append(read, "delete", "patch")),
				rule("skein.dev", []string{"blockrequests"}, append(read, "delete")),
				rule("", []string{"nodes"}, read),
				// An Egress's namespace's allow-custom-pods annotation.
				rule("", []string{"namespaces"}, read),
				rule("skein.dev", []string{"egresses"}, read),
				rule("skein.dev", []string{"egresses/status", "egresses/finalizers"}, []string{"update"}),
				rule("apps", []string{"deployments"}, append(read, "create", "update", "delete")),
				rule("", []string{"services"}, append(read, "create", "update", "delete")),
				// The Egress routers' accounts and their binding, by name.
				rule("", []string{"serviceaccounts"}, []string{"create"}),
				named(rule("", []string{"serviceaccounts"}, []string{"get", "update", "delete"}), "skein-egress"),
				rule(rbacv1.GroupName, []string{"clusterrolebindings"}, []string{"create"}),
				named(rule(rbacv1.GroupName, []string{"clusterrolebindings"}, []string{"get", "update"}), "skein-egress"),
				named(rule(rbacv1.GroupName, []string{"clusterroles"}, []string{"bind"}), "skein-egress"),
				rule(rbacv1.GroupName, []string{"roles"}, []string{"create"}),
				named(rule(rbacv1.GroupName, []string{"roles"}, []string{"get", "update", "delete"}), "skein-egress"),
				rule(rbacv1.GroupName, []string{"rolebindings"}, []string{"get", "list", "create", "update", "delete"}),
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controllerUser},
			Subjects:   subject,
		},
		// Its namespace: the leader election Lease and the nodes' Leases.
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: controllerUser},
			Rules: []rbacv1.PolicyRule{
				rule("coordination.k8s.io", []string{"leases"}, []string{"get", "list", "create", "update", "delete"}),
				rule("", []string{"events"}, []string{"create", "patch"}),
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: controllerUser},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: controllerUser},
			Subjects:   subject,
		},
	}
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// startBinary runs skein-controller against env (kubenode.StartController)
// with a short Lease in the test's namespace and quick GC and status, and
// waits until its health endpoint answers.
func startBinary(t *testing.T, env *kube.Env, name string) *kubenode.Controller {
	t.Helper()
	kc, err := env.WriteKubeconfig(controllerUser)
	if err != nil {
		t.Fatal(err)
	}
	return kubenode.StartController(t, kc, name,
		"--leader-elect-namespace", namespace, "--lease-namespace", namespace, "--leader-elect-lease-duration", "6s",
		"--leader-elect-renew-deadline", "4s", "--leader-elect-retry-period", "300ms",
		"--node-gc-grace", "2s", "--pool-status-interval", "1s")
}

func waitFor(t *testing.T, what string, cond func() string) {
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
		time.Sleep(50 * time.Millisecond)
	}
}

// scrape returns the samples of p's metrics endpoint whose names start
// with skein_, as "name{labels}" → value.
func scrape(t *testing.T, p *kubenode.Controller) map[string]string {
	t.Helper()
	resp, err := http.Get(p.Metrics)
	if err != nil {
		t.Fatalf("scrape %s: %v", p.Metrics, err)
	}
	defer resp.Body.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "skein_") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			m[line[:i]] = line[i+1:]
		}
	}
	return m
}

func leaseHolder(t *testing.T, c client.Client) string {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: "skein-controller"}, l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// claim makes block idx of pool bin as node's skeind does.
func claim(t *testing.T, c client.Client, pool *skeinv1.AddressPool, idx uint32, node string) {
	t.Helper()
	blk := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{
			Name:       skeinv1.BlockName(pool.Name, idx),
			Labels:     map[string]string{skeinv1.LabelPool: pool.Name, skeinv1.LabelNode: node},
			Finalizers: []string{skeinv1.FinalizerBlock},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: skeinv1.GroupVersion.String(), Kind: "AddressPool", Name: pool.Name, UID: pool.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		NodeName: node,
		Index:    int64(idx),
		IPv4:     ptr.To(fmt.Sprintf("10.110.%d.%d/27", idx/8, idx%8*32)),
	}
	if err := c.Create(context.Background(), blk); err != nil {
		t.Errorf("claim block %s: %v", blk.Name, err)
	}
}

// nodeLease writes node's liveness Lease as its skeind does, renewed now.
func nodeLease(c client.Client, node string) error {
	ctx := context.Background()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: skeinv1.NodeLeaseName(node)}}
	err := c.Get(ctx, client.ObjectKeyFromObject(l), l)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	l.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(2)),
		RenewTime: &metav1.MicroTime{Time: time.Now()}}
	if apierrors.IsNotFound(err) {
		return c.Create(ctx, l)
	}
	return c.Update(ctx, l)
}

// nodeBlocks is how many blocks node owns.
func nodeBlocks(t *testing.T, c client.Client, node string) int {
	t.Helper()
	var l skeinv1.AddressBlockList
	if err := c.List(context.Background(), &l, client.MatchingLabels{skeinv1.LabelNode: node}); err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// TestBinary runs two skein-controller processes on one Lease against the
// real API server, with the permissions of controller-rbac.yaml: the first
// leads, keeps the pool's status and serves the skein metrics; a node
// whose Node is deleted while it renews its Lease keeps its blocks, one
// without a Lease loses them. SIGKILLed in the middle of a burst of
// claims, the leader is replaced by the second once the Lease expires,
// which brings the status up to date and, when the live node stops
// renewing, takes its blocks and Lease back.
func TestBinary(t *testing.T) {
	env := kube.Start(t, kube.Options{Users: []kube.User{{Name: controllerUser}}})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	grantControllerRole(t, c)
	const nodes = 4
	for i := range nodes {
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bin-n%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	pool := &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "bin"},
		Spec:       skeinv1.AddressPoolSpec{BlockSizeBits: 5, Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.110.0.0/21")}}}, // 64 blocks
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// bin-n1's skeind runs throughout (until told to stop).
	stopN1 := make(chan struct{})
	var wg sync.WaitGroup
	if err := nodeLease(c, "bin-n1"); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		for {
			select {
			case <-stopN1:
				return
			case <-time.After(300 * time.Millisecond):
			}
			if err := nodeLease(c, "bin-n1"); err != nil {
				t.Errorf("renew the Lease of bin-n1: %v", err)
			}
		}
	})
	defer func() {
		select {
		case <-stopN1:
		default:
			close(stopN1)
		}
		wg.Wait()
	}()

	a := startBinary(t, env, "ctrl-a")
	var holderA string
	waitFor(t, "the first controller to take the Lease", func() string {
		if holderA = leaseHolder(t, c); holderA == "" {
			return "no holder"
		}
		return ""
	})
	b := startBinary(t, env, "ctrl-b")
	allocated := func() int64 {
		p := &skeinv1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "bin"}, p); err != nil {
			t.Fatal(err)
		}
		return p.Status.BlocksAllocated
	}

	// First burst: the leader follows it in the status and its metrics.
	for i := range uint32(8) {
		claim(t, c, pool, i, fmt.Sprintf("bin-n%d", i%nodes))
	}
	waitFor(t, "the pool's status after the first burst", func() string {
		if n := allocated(); n != 8 {
			return fmt.Sprintf("%d blocks", n)
		}
		return ""
	})
	want := map[string]string{
		`skein_pool_blocks_allocated{pool="bin"}`:           "8",
		`skein_pool_blocks_total{pool="bin"}`:               "64",
		`skein_reconcile_errors_total{controller="nodegc"}`: "0",
		`skein_pool_status_writes_total`:                    "",
	}
	waitFor(t, "the leader's metrics", func() string {
		got := scrape(t, a)
		for k, v := range want {
			if g, ok := got[k]; !ok || (v != "" && g != v) {
				return fmt.Sprintf("%s = %q (present %v), want %q", k, g, ok, v)
			}
		}
		return ""
	})
	if got := scrape(t, b)[`skein_pool_status_writes_total`]; got != "0" {
		t.Errorf("the standby wrote pool status %s times", got)
	}

	// Two Nodes deleted: bin-n1's skeind renews its Lease, bin-n0 has
	// none. Only bin-n0's blocks go.
	for _, n := range []string{"bin-n0", "bin-n1"} {
		if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the blocks of bin-n0, which has no Lease", func() string {
		if n := nodeBlocks(t, c, "bin-n0"); n > 0 {
			return fmt.Sprintf("%d blocks", n)
		}
		return ""
	})
	waitFor(t, "the leader to look at bin-n1 and keep its blocks", func() string {
		if n := nodeBlocks(t, c, "bin-n1"); n != 2 {
			t.Fatalf("bin-n1, alive without its Node, has %d blocks, want 2", n)
		}
		if g := scrape(t, a)[`skein_gc_deferred_total`]; g == "" || g == "0" {
			return fmt.Sprintf("skein_gc_deferred_total %q", g)
		}
		return ""
	})

	// Second burst: the leader is SIGKILLed in the middle of it.
	const n = 32
	for i := uint32(8); i < 8+n; i++ {
		claim(t, c, pool, i, fmt.Sprintf("bin-n%d", 2+i%2))
		if i == 8+n/2 {
			a.Kill(t)
		}
	}
	killed := time.Now()
	waitFor(t, "the other controller to take the Lease", func() string {
		if h := leaseHolder(t, c); h == holderA {
			return "held by the killed one"
		}
		return ""
	})
	t.Logf("Lease taken over %v after the leader was killed", time.Since(killed).Round(time.Millisecond))
	total := int64(8 - 2 + n) // bin-n0's two blocks are gone
	waitFor(t, "the new leader's status and metrics", func() string {
		if got := allocated(); got != total {
			return fmt.Sprintf("status: %d blocks, want %d", got, total)
		}
		if g := scrape(t, b)[`skein_pool_blocks_allocated{pool="bin"}`]; g != fmt.Sprint(total) {
			return fmt.Sprintf("blocks allocated %q", g)
		}
		return ""
	})
	if h := leaseHolder(t, c); h == "" || h == holderA {
		t.Errorf("Lease holder %q after the leader was killed, want the other controller (not %q)", h, holderA)
	}

	// bin-n1's skeind stops: the new leader takes its blocks and Lease.
	close(stopN1)
	wg.Wait()
	waitFor(t, "bin-n1's blocks and Lease, once it stopped renewing", func() string {
		l := &coordinationv1.Lease{}
		err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: skeinv1.NodeLeaseName("bin-n1")}, l)
		if blocks := nodeBlocks(t, c, "bin-n1"); blocks > 0 || !apierrors.IsNotFound(err) {
			return fmt.Sprintf("%d blocks, get Lease: %v", blocks, err)
		}
		return ""
	})
	waitFor(t, "the pool's status after the collection", func() string {
		if got := allocated(); got != total-2 {
			return fmt.Sprintf("%d blocks, want %d", got, total-2)
		}
		return ""
	})

	// The permissions granted were enough for everything done.
	for _, p := range []*kubenode.Controller{a, b} {
		if log, _ := os.ReadFile(p.Log); strings.Contains(string(log), "forbidden") {
			t.Errorf("%s was refused something:\n%s", p.Log, log)
		}
	}
}

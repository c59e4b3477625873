package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

func TestFlagCheck(t *testing.T) {
	good := flags{gcInterval: time.Minute, brWorkers: 4, qps: 100, burst: 200, leaderElect: true, leaseName: "x",
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
		"no blockrequest workers":       func(f *flags) { f.brWorkers = 0 },
	} {
		f := good
		mod(&f)
		if err := f.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// controllerUser is who the binaries run as, with only the permissions
// the README lists.
const controllerUser = "skein-controller"

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
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
			Rules: []rbacv1.PolicyRule{
				rule("skein.dev", []string{"addresspools"}, append(read, "update")),
				rule("skein.dev", []string{"addresspools/status", "addresspools/finalizers"}, []string{"update"}),
				rule("skein.dev", []string{"addressblocks"}, append(read, "create", "delete", "patch")),
				rule("skein.dev", []string{"blockrequests"}, append(read, "delete")),
				rule("skein.dev", []string{"blockrequests/status"}, []string{"update"}),
				rule("", []string{"nodes"}, read),
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
			},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controllerUser},
			Subjects:   subject,
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: controllerUser},
			Rules: []rbacv1.PolicyRule{
				rule("coordination.k8s.io", []string{"leases"}, []string{"get", "create", "update"}),
				rule("", []string{"events"}, []string{"create", "patch"}),
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: controllerUser},
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

// controllerProc is a running skein-controller binary.
type controllerProc struct {
	cmd     *exec.Cmd
	metrics string // http://127.0.0.1:port/metrics
	log     string
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startBinary runs skein-controller against env with a short Lease and
// waits until its health endpoint answers.
func startBinary(t *testing.T, env *kube.Env, name string) *controllerProc {
	t.Helper()
	kc, err := env.WriteKubeconfig(controllerUser)
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	p := &controllerProc{metrics: "http://" + metricsAddr + "/metrics", log: filepath.Join(t.TempDir(), name+".log")}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(filepath.Join(skeintest.Binaries(t), "skein-controller"),
		"--kubeconfig", kc, "--metrics-addr", metricsAddr, "--health-addr", healthAddr,
		"--leader-elect-namespace", "kube-system", "--leader-elect-lease-duration", "3s",
		"--leader-elect-renew-deadline", "2s", "--leader-elect-retry-period", "250ms", "--gc-interval", "2s", "--webhook-port", "0")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		p.cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("log of %s:\n%s", name, b)
		}
	})
	waitFor(t, name+" healthy", func() string {
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
func (p *controllerProc) scrape(t *testing.T) map[string]string {
	t.Helper()
	resp, err := http.Get(p.metrics)
	if err != nil {
		t.Fatalf("scrape %s: %v", p.metrics, err)
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
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "skein-controller"}, l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// TestBinary runs two skein-controller processes on one Lease against the
// real API server: the first leads and carves, its metrics endpoint serves
// the skein metrics; SIGKILLed in the middle of a burst, the second takes
// over once the Lease expires and serves every request, no index twice.
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

	a := startBinary(t, env, "ctrl-a")
	var holderA string
	waitFor(t, "the first controller to take the Lease", func() string {
		if holderA = leaseHolder(t, c); holderA == "" {
			return "no holder"
		}
		return ""
	})
	b := startBinary(t, env, "ctrl-b")

	request := func(i int) *skeinv1.BlockRequest {
		br := &skeinv1.BlockRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "bin-"},
			Spec:       skeinv1.BlockRequestSpec{NodeName: fmt.Sprintf("bin-n%d", i%nodes), PoolName: "bin"},
		}
		if err := c.Create(ctx, br); err != nil {
			t.Errorf("create request: %v", err)
		}
		return br
	}
	complete := func() (done int, blocks map[string]string) {
		var l skeinv1.BlockRequestList
		if err := c.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		blocks = map[string]string{}
		for _, br := range l.Items {
			if meta.IsStatusConditionTrue(br.Status.Conditions, skeinv1.ConditionComplete) {
				done++
				if prev, dup := blocks[br.Status.AddressBlockName]; dup {
					t.Fatalf("block %s given to both %s and %s", br.Status.AddressBlockName, prev, br.Name)
				}
				blocks[br.Status.AddressBlockName] = br.Name
			}
		}
		return done, blocks
	}

	// First burst: the leader serves it and reports it in its metrics.
	for i := range 8 {
		request(i)
	}
	waitFor(t, "first burst", func() string {
		if n, _ := complete(); n < 8 {
			return fmt.Sprintf("%d of 8 complete", n)
		}
		return ""
	})
	want := map[string]string{
		`skein_pool_blocks_allocated{pool="bin"}`:           "8",
		`skein_pool_blocks_total{pool="bin"}`:               "64",
		`skein_blockrequests_total{result="Complete"}`:      "8",
		`skein_blockrequest_latency_seconds_count`:          "8",
		`skein_reconcile_errors_total{controller="nodegc"}`: "",
	}
	waitFor(t, "the leader's metrics", func() string {
		got := a.scrape(t)
		for k, v := range want {
			if g, ok := got[k]; !ok || (v != "" && g != v) {
				return fmt.Sprintf("%s = %q (present %v), want %q", k, g, ok, v)
			}
		}
		return ""
	})
	if got := b.scrape(t); got[`skein_blockrequests_total{result="Complete"}`] != "" {
		t.Errorf("the standby served requests: %v", got)
	}

	// Second burst: the leader is SIGKILLed in the middle of it.
	const n = 32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { request(i) })
	}
	waitFor(t, "part of the second burst", func() string {
		if done, _ := complete(); done < 8+3 {
			return fmt.Sprintf("%d complete", done)
		}
		return ""
	})
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	wg.Wait()
	waitFor(t, "the other controller to take the Lease", func() string {
		if h := leaseHolder(t, c); h == holderA {
			return "held by the killed one"
		}
		return ""
	})
	t.Logf("Lease taken over %v after the leader was killed", time.Since(killed).Round(time.Millisecond))
	waitFor(t, "every request served after the takeover", func() string {
		if done, _ := complete(); done < 8+n {
			return fmt.Sprintf("%d of %d complete", done, 8+n)
		}
		return ""
	})
	t.Logf("all served %v after the leader was killed", time.Since(killed).Round(time.Millisecond))
	if h := leaseHolder(t, c); h == "" || h == holderA {
		t.Errorf("Lease holder %q after the leader was killed, want the other controller (not %q)", h, holderA)
	}
	_, owner := complete()
	var blocks skeinv1.AddressBlockList
	if err := c.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelPool: "bin"}); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]string{}
	for _, blk := range blocks.Items {
		if prev, dup := seen[blk.Index]; dup {
			t.Errorf("index %d in blocks %s and %s", blk.Index, prev, blk.Name)
		}
		seen[blk.Index] = blk.Name
		if _, ok := owner[blk.Name]; !ok {
			t.Errorf("block %s belongs to no complete request", blk.Name)
		}
	}
	if len(blocks.Items) != 8+n {
		t.Errorf("%d blocks for %d requests", len(blocks.Items), 8+n)
	}
	waitFor(t, "the new leader's metrics", func() string {
		if g := b.scrape(t)[`skein_pool_blocks_allocated{pool="bin"}`]; g != fmt.Sprint(8+n) {
			return fmt.Sprintf("blocks allocated %q", g)
		}
		return ""
	})

	// A Node deleted: its blocks and requests go, the pool's status follows.
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bin-n0"}}); err != nil {
		t.Fatal(err)
	}
	left := 8 + n - (8+n+nodes-1)/nodes // requests i with i%nodes == 0 were bin-n0's
	waitFor(t, "the deleted node's objects removed", func() string {
		var bl skeinv1.AddressBlockList
		if err := c.List(ctx, &bl, client.MatchingLabels{skeinv1.LabelNode: "bin-n0"}); err != nil {
			return err.Error()
		}
		var rl skeinv1.BlockRequestList
		if err := c.List(ctx, &rl); err != nil {
			return err.Error()
		}
		p := &skeinv1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "bin"}, p); err != nil {
			return err.Error()
		}
		if len(bl.Items) > 0 || len(rl.Items) != left || p.Status.BlocksAllocated != int64(left) {
			return fmt.Sprintf("%d blocks of bin-n0, %d requests (want %d), pool status %d blocks",
				len(bl.Items), len(rl.Items), left, p.Status.BlocksAllocated)
		}
		return ""
	})

	// The permissions granted were enough for everything done.
	for _, p := range []*controllerProc{a, b} {
		if log, _ := os.ReadFile(p.log); strings.Contains(string(log), "forbidden") {
			t.Errorf("%s was refused something:\n%s", p.log, log)
		}
	}
}

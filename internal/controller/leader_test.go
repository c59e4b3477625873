package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

// electedManager is a manager running every reconciler under leader
// election on one Lease, writing as field manager name.
type electedManager struct {
	mgr    ctrl.Manager
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	name   string
}

func startElected(t *testing.T, env *kube.Env, name string) *electedManager {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = name // the API server names the field manager after it
	// Short for a quick take-over, but a renewal may take 4 s: an API
	// server loaded by other packages' tests must not cost the leader its
	// lease.
	lease, renew, retry := 6*time.Second, 4*time.Second, 300*time.Millisecond
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        kube.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
		LeaderElection:                true,
		LeaderElectionID:              "skein-controller",
		LeaderElectionNamespace:       "kube-system",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &lease,
		RenewDeadline:                 &renew,
		RetryPeriod:                   &retry,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := Setup(mgr, Options{NodeGCGrace: time.Second, PoolStatusInterval: time.Second}); err != nil {
		t.Fatal(err)
	}
	m := &electedManager{mgr: mgr, cancel: cancel, done: make(chan error, 1), name: name}
	go func() { m.done <- mgr.Start(ctx) }()
	t.Cleanup(func() { m.stop(t) })
	return m
}

// stop stops m (once) and reports a manager error.
func (m *electedManager) stop(t *testing.T) {
	m.once.Do(func() {
		m.cancel()
		if err := <-m.done; err != nil {
			t.Errorf("manager %s: %v", m.name, err)
		}
	})
}

func elected(m *electedManager) bool {
	select {
	case <-m.mgr.Elected():
		return true
	default:
		return false
	}
}

// statusWriters returns the field managers of o's status.
func statusWriters(o client.Object) []string {
	var w []string
	for _, f := range o.GetManagedFields() {
		if f.Subresource == "status" {
			w = append(w, f.Manager)
		}
	}
	sort.Strings(w)
	return w
}

// TestLeaderElection runs two managers on one Lease: only the leader
// reconciles; when the leader stops in the middle of a burst of claims,
// the other takes over: it brings the pool's status up to date and
// collects the blocks of a node gone for good.
func TestLeaderElection(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	leaseNamespace(t, c)
	const nodes = 5
	for i := range nodes {
		kubenode.CreateNode(t, c, fmt.Sprintf("le-n%d", i))
	}

	a := startElected(t, env, "ctrl-a")
	select {
	case <-a.mgr.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the first manager was not elected in 30 s")
	}
	b := startElected(t, env, "ctrl-b")
	if err := c.Create(ctx, newPool("le", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.105.0.0/21")})); err != nil { // 64 blocks
		t.Fatal(err)
	}

	// A first burst, seen by the leader alone.
	for i := range uint32(8) {
		makeBlock(t, c, "le", i, fmt.Sprintf("le-n%d", i%nodes), false)
	}
	eventually(t, "the pool's status after the first burst", func() string {
		if p := getPool(t, c, "le"); p.Status.BlocksAllocated != 8 {
			return poolState(p)
		}
		return ""
	})
	if elected(b) {
		t.Fatal("both managers lead")
	}
	if w := statusWriters(getPool(t, c, "le")); fmt.Sprint(w) != "[ctrl-a]" {
		t.Errorf("pool status written by %v while ctrl-a led, want only ctrl-a", w)
	}

	// A second burst; the leader stops while it comes in.
	const n = 40
	for i := uint32(8); i < 8+n; i++ {
		makeBlock(t, c, "le", i, fmt.Sprintf("le-n%d", i%nodes), false)
		if i == 8+n/2 {
			a.stop(t)
		}
	}
	select {
	case <-b.mgr.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the second manager did not take over in 30 s")
	}
	eventually(t, "the pool's status after the takeover", func() string {
		if p := getPool(t, c, "le"); p.Status.BlocksAllocated != 8+n {
			return poolState(p)
		}
		return ""
	})
	if w := statusWriters(getPool(t, c, "le")); !slices.Contains(w, "ctrl-b") {
		t.Errorf("pool status written by %v after the takeover, want ctrl-b among them", w)
	}

	// The new leader collects: a node without a Lease, its Node deleted.
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "le-n0"}}); err != nil {
		t.Fatal(err)
	}
	left := 8 + n - (8+n+nodes-1)/nodes // blocks i with i%nodes == 0 were le-n0's
	eventually(t, "the deleted node's blocks collected by the new leader", func() string {
		var l skeinv1.AddressBlockList
		if err := c.List(ctx, &l, client.MatchingLabels{skeinv1.LabelNode: "le-n0"}); err != nil {
			return err.Error()
		}
		if p := getPool(t, c, "le"); len(l.Items) > 0 || p.Status.BlocksAllocated != int64(left) {
			return fmt.Sprintf("%d blocks of le-n0, pool %s", len(l.Items), poolState(p))
		}
		return ""
	})
}

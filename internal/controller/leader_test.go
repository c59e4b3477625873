package controller

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// electedManager is a manager running every reconciler under leader
// election on one Lease, writing as field manager name.
type electedManager struct {
	mgr    ctrl.Manager
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startElected(t *testing.T, env *kube.Env, name string) *electedManager {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = name // the API server names the field manager after it
	lease, renew, retry := 3*time.Second, 2*time.Second, 200*time.Millisecond
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
	if err := Setup(mgr, Options{}); err != nil {
		t.Fatal(err)
	}
	m := &electedManager{mgr: mgr, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- mgr.Start(ctx) }()
	t.Cleanup(func() { m.stop(t) })
	return m
}

// stop stops m (once) and reports a manager error.
func (m *electedManager) stop(t *testing.T) {
	m.once.Do(func() {
		m.cancel()
		checkStopped(t, <-m.done)
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

// statusWriters returns the field managers of br's status.
func statusWriters(br *skeinv1.BlockRequest) []string {
	var w []string
	for _, f := range br.ManagedFields {
		if f.Subresource == "status" {
			w = append(w, f.Manager)
		}
	}
	sort.Strings(w)
	return w
}

// TestLeaderElection runs two managers on one Lease: only the leader
// reconciles; when the leader stops mid-burst the other takes over and
// every request gets a block of its own, no index twice.
func TestLeaderElection(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, newPool("le", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.105.0.0/21")})); err != nil { // 64 blocks
		t.Fatal(err)
	}
	const nodes = 5
	for i := range nodes {
		newNode(t, c, fmt.Sprintf("le-n%d", i))
	}

	a := startElected(t, env, "ctrl-a")
	select {
	case <-a.mgr.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the first manager was not elected in 30 s")
	}
	b := startElected(t, env, "ctrl-b")

	// A first burst, served by the leader alone.
	var first []*skeinv1.BlockRequest
	for i := range 8 {
		first = append(first, answer(c, t, request(c, t, fmt.Sprintf("le-n%d", i%nodes), "le")))
	}
	if elected(b) {
		t.Fatal("both managers lead")
	}
	for _, br := range first {
		if w := statusWriters(br); len(w) != 1 || w[0] != "ctrl-a" {
			t.Errorf("request %s: status written by %v while ctrl-a led, want only ctrl-a", br.Name, w)
		}
	}

	// A second burst; the leader stops while it is being served.
	const n = 40
	second := make([]*skeinv1.BlockRequest, n)
	var wg sync.WaitGroup
	for i := range second {
		wg.Go(func() { second[i] = request(c, t, fmt.Sprintf("le-n%d", i%nodes), "le") })
	}
	eventually(t, "some of the second burst served", func() string {
		var l skeinv1.BlockRequestList
		if err := c.List(ctx, &l); err != nil {
			return err.Error()
		}
		done := 0
		for _, br := range l.Items {
			if meta.IsStatusConditionTrue(br.Status.Conditions, skeinv1.ConditionComplete) {
				done++
			}
		}
		if done < len(first)+3 {
			return fmt.Sprintf("%d complete", done)
		}
		return ""
	})
	if elected(b) {
		t.Fatal("both managers lead")
	}
	a.stop(t)
	wg.Wait()
	select {
	case <-b.mgr.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the second manager did not take over in 30 s")
	}

	owner := map[string]string{} // block → request
	byB := 0
	for _, br := range append(first, second...) {
		got := answer(c, t, br)
		if !meta.IsStatusConditionTrue(got.Status.Conditions, skeinv1.ConditionComplete) {
			t.Errorf("request %s: %+v, want Complete", br.Name, got.Status)
			continue
		}
		if prev, dup := owner[got.Status.AddressBlockName]; dup {
			t.Errorf("block %s given to both %s and %s", got.Status.AddressBlockName, prev, got.Name)
		}
		owner[got.Status.AddressBlockName] = string(got.UID)
		for _, w := range statusWriters(got) {
			if w == "ctrl-b" {
				byB++
			}
		}
	}
	if byB == 0 {
		t.Errorf("ctrl-b served none of the requests after taking over")
	}
	blocks := blocksOf(c, t, "le")
	if len(blocks) != len(owner) {
		t.Errorf("%d blocks for %d requests", len(blocks), len(owner))
	}
	seen := map[int64]string{}
	for _, blk := range blocks {
		if prev, dup := seen[blk.Index]; dup {
			t.Errorf("index %d in blocks %s and %s", blk.Index, prev, blk.Name)
		}
		seen[blk.Index] = blk.Name
		if owner[blk.Name] != blk.Labels[skeinv1.LabelRequest] {
			t.Errorf("block %s carries request %s, whose status does not name it", blk.Name, blk.Labels[skeinv1.LabelRequest])
		}
	}
	t.Logf("ctrl-b served %d of %d requests after the takeover", byB, len(owner))
}

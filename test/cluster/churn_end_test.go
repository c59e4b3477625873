package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/skeinnet/skein/api/rpc"
	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
)

// chaos kills for d, on the test's goroutine: a skeind every 4–8 s (the
// nodes in turn, in an order rng shuffles), restarted 0.3–1.5 s later;
// the leading controller at a quarter and at five eighths of d, started
// again once the other has taken over. It returns what it did.
func (c *churn) chaos(t *testing.T, rng *rand.Rand, d time.Duration) string {
	t.Helper()
	start := time.Now()
	leaderAt := []time.Duration{d / 4, d * 5 / 8}
	var order []*node
	nextKill := start.Add(2*time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
	killed := map[string]int{}
	skeinds, leaders := 0, 0
	at := func() string { return time.Since(start).Round(100 * time.Millisecond).String() }
	for time.Since(start) < d {
		if len(leaderAt) > 0 && time.Since(start) >= leaderAt[0] {
			leaderAt = leaderAt[1:]
			old := Leader(t, kubenode.Wait, c.w.ctrls...)
			old.Kill(t)
			t.Logf("at %s: killed the leading controller %s", at(), old.Name)
			var rest []*Controller
			for _, ctl := range c.w.ctrls {
				if ctl != old {
					rest = append(rest, ctl)
				}
			}
			now := Leader(t, kubenode.Wait, rest...)
			t.Logf("at %s: %s leads", at(), now.Name)
			old.Start(t)
			leaders++
			continue
		}
		if time.Now().After(nextKill) {
			if len(order) == 0 {
				order = slices.Clone(c.w.nodes)
				rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			}
			n := order[0]
			order = order[1:]
			n.kill(t)
			down := 300*time.Millisecond + time.Duration(rng.Int64N(int64(1200*time.Millisecond)))
			t.Logf("at %s: killed skeind on %s for %v", at(), n.Name, down)
			time.Sleep(down)
			n.restart(t)
			killed[n.Name]++
			skeinds++
			nextKill = time.Now().Add(4*time.Second + time.Duration(rng.Int64N(int64(4*time.Second))))
			continue
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range c.w.nodes {
		if killed[n.Name] == 0 {
			t.Errorf("skeind on %s was never killed in %v of churn", n.Name, d)
		}
	}
	if leaders == 0 {
		t.Errorf("the leading controller was never killed in %v of churn", d)
	}
	return fmt.Sprintf("%d skeind kills %v, %d leader kills", skeinds, killed, leaders)
}

// drainAll DELs every pod left, live or pending (every skeind is up).
func (c *churn) drainAll(t *testing.T) {
	t.Helper()
	for _, s := range c.slots {
		c.mu.Lock()
		if s.live != nil {
			s.live, s.pending = nil, s.live
		}
		c.mu.Unlock()
		c.drain(s, time.Minute)
	}
}

// final checks the cluster once every pod is gone: nothing held, nothing
// left in the kernel, the blocks exactly the spares, the Leases fresh,
// and the nodes' tokens still under the policy.
func (c *churn) final(t *testing.T, base map[*node]harness.State) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), apiWait)
	defer cancel()
	for _, n := range c.w.nodes {
		admin := n.D.Admin(t)
		atts, err := admin.ListAttachments(ctx, &rpc.AttachmentFilter{})
		if err != nil {
			t.Fatalf("%s: list attachments: %v", n.Name, err)
		}
		for _, a := range atts.Attachments {
			t.Errorf("%s: skeind still holds %s/%s %v after every pod was DELed", n.Name, a.Network, a.ContainerId, a.Addresses)
		}
		for _, pool := range []string{skeinv1.DefaultPool, "other"} {
			p, err := admin.GetPool(ctx, &rpc.PoolRef{Name: pool})
			switch {
			case err != nil:
				t.Errorf("%s: pool %s: %v", n.Name, pool, err)
			case p.Used != 0:
				t.Errorf("%s: skeind counts %d addresses of pool %s used after every pod was DELed", n.Name, p.Used, pool)
			}
		}
		if links := nodeLinks(t, n); len(links) > 0 {
			t.Errorf("%s: links left in the node namespace after every pod was DELed (leaked veths): %v", n.Name, links)
		}
		harness.AssertSame(t, base[n], n.D.NodeState(t))
	}
	for _, s := range c.slots {
		if a, err := PodAddrs(s.ns.Path(), "eth0"); err != nil || len(a) > 0 || hasLink(t, s.ns, "eth0") {
			t.Errorf("pod namespace %s of %s still has eth0 (%v, %v) after every pod was DELed", s.ns.Name(), s.node.Name, a, err)
		}
	}

	// The blocks left: one spare of the default pool per node, none of
	// pool other once --block-min-age has passed (and skeind's next pass).
	var blocks []skeinv1.AddressBlock
	kubenode.Eventually(t, 30*time.Second, "the blocks left to be the spares", func() string {
		var err error
		if blocks, err = c.w.blocks(); err != nil {
			return err.Error()
		}
		count := map[string]int{}
		var extra []string
		for _, b := range blocks {
			pool := b.Labels[skeinv1.LabelPool]
			if pool == skeinv1.DefaultPool && slices.ContainsFunc(c.w.nodes, func(n *node) bool { return n.Name == b.NodeName }) {
				count[b.NodeName]++
			} else {
				extra = append(extra, fmt.Sprintf("%s (pool %s, node %s)", b.Name, pool, b.NodeName))
			}
		}
		var bad []string
		for _, n := range c.w.nodes {
			if count[n.Name] != 1 {
				bad = append(bad, fmt.Sprintf("%s has %d blocks of the default pool", n.Name, count[n.Name]))
			}
		}
		if len(extra) > 0 {
			bad = append(bad, "blocks no design keeps: "+strings.Join(extra, ", "))
		}
		return strings.Join(bad, "; ")
	})
	for _, p := range BlockProblems(blocks) {
		t.Error(p)
	}
	if reqs, err := c.w.requests(); err != nil || len(reqs) > 0 {
		t.Errorf("BlockRequests after the churn: %d (%v)", len(reqs), err)
	}
	for i, n := range c.w.nodes {
		// skeind's own view agrees with the API server's.
		l, err := n.D.Admin(t).ListBlocks(ctx, &rpc.BlockFilter{})
		if err != nil {
			t.Fatalf("%s: list blocks: %v", n.Name, err)
		}
		var mine []string
		for _, b := range l.Blocks {
			if b.Node == n.Name {
				mine = append(mine, skeinv1.BlockName(b.Pool, b.Index))
			}
		}
		var api []string
		for _, b := range blocks {
			if b.NodeName == n.Name {
				api = append(api, b.Name)
			}
		}
		if !slices.Equal(mine, api) {
			t.Errorf("%s: skeind says its blocks are %v, the API server %v", n.Name, mine, api)
		}
		lease, err := c.w.lease(n.Name)
		switch {
		case err != nil:
			t.Error(err)
		case lease == nil || lease.Spec.RenewTime == nil:
			t.Errorf("%s: no renewed Lease after the churn: %v", n.Name, lease)
		case time.Since(lease.Spec.RenewTime.Time) > churnLease:
			t.Errorf("%s: its Lease was last renewed %v ago", n.Name, time.Since(lease.Spec.RenewTime.Time))
		}
		// The credentials skeind ran with were under the policy all
		// along: they still may not make another node's block.
		cfg, err := clientcmd.BuildConfigFromFlags("", n.kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := kube.NewClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := refused(ctx, c.w.admin, nc, n.Name, 1000+i); err != nil {
			t.Errorf("%s's credentials after the churn: %v", n.Name, err)
		}
	}
}

// nodeLinks names the links of n's namespace but lo: skein's veths.
func nodeLinks(t *testing.T, n *node) []string {
	t.Helper()
	links, err := n.D.Node.Handle(t).LinkList()
	if err != nil {
		t.Fatalf("links of %s: %v", n.Name, err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

func hasLink(t *testing.T, ns *harness.NS, name string) bool {
	t.Helper()
	_, err := ns.Handle(t).LinkByName(name)
	return err == nil
}

package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// Settings of TestLiveNodeDeleted: short enough that the controller
// would have taken the deleted node's blocks several times over while
// the test watches, were it not for the node's Lease.
const (
	ldLease = 4 * time.Second // skeind --lease-duration
	ldGrace = 3 * time.Second // skein-controller --node-gc-grace
	// ldWatch is how long the deleted node keeps running and ADDing:
	// the Lease, the grace and the controller's 2 s sweep, twice over.
	ldWatch = 2 * (ldLease + ldGrace + 2*time.Second)
)

// TestLiveNodeDeleted is `kubectl delete node` of a node whose skeind
// keeps running, and keeps ADDing and DELing pods, as when an operator
// deletes the wrong Node or a cloud controller deletes a NotReady node
// that comes back. Three real skeinds (each with its own node's
// identity), the real controller, a pool of 8 blocks of 4 addresses:
// the three nodes fill six blocks, then ld-n1's Node is deleted while
// all three go on ADDing, so that the other two exhaust the pool and
// would claim ld-n1's blocks the moment the controller gave them back.
//
// Every second until well past ld-n1's Lease, grace and the GC's sweep,
// it reads every pod's eth0 on every node, every AddressBlock, ld-n1's
// Lease and every node's export table, and fails on: an address on two
// pods at once; a pod's address outside a block of its own node; a block
// of ld-n1 deleted or given to another node while its Lease is fresh; a
// node exporting a block another node owns; a Lease not renewed by a
// running skeind. Then ld-n1's skeind is killed (the node is gone for
// real): its blocks and Lease must go, not before the Lease plus the
// grace has passed, and the other nodes can use its blocks again.
func TestLiveNodeDeleted(t *testing.T) {
	harness.RequireRoot(t)
	o := worldOptions{
		nodes: []string{"ld-n1", "ld-n2", "ld-n3"},
		pools: []skeinv1.AddressPool{{
			ObjectMeta: metav1.ObjectMeta{Name: "small"},
			Spec:       skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.160.0.0/27")}}, BlockSizeBits: 2},
		}},
		namespaces: map[string]string{"apps": "small"},
		// Nothing is given back during the test: a block of ld-n1 that
		// goes is the controller's doing.
		skeind:     []string{"--lease-duration", ldLease.String(), "--block-min-age", "10m"},
		controller: []string{"--node-gc-grace", ldGrace.String()},
	}
	w := startWorld(t, o)
	n1, others := w.nodes[0], w.nodes[1:]
	var (
		mu     sync.Mutex
		pods   []*pod
		freeze sync.RWMutex // held (read) by each ADD and DEL; a check takes it to see one moment
		found  = &problems{start: time.Now()}
	)
	podNS := func(count int) []*harness.NS {
		var out []*harness.NS
		for range count {
			out = append(out, harness.NewNS(t, "pod"))
		}
		return out
	}

	// Six pods per node: two blocks each, six of the pool's eight.
	var wg sync.WaitGroup
	for _, n := range w.nodes {
		nss := podNS(6)
		wg.Go(func() {
			for i, ns := range nss {
				p, err := n.add(ns, "apps", fmt.Sprintf("%s-a%d", n.Name, i))
				if err != nil {
					found.add(err.Error())
					return
				}
				mu.Lock()
				pods = append(pods, p)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	found.report(t, "the first pods")
	if t.Failed() {
		t.FailNow()
	}
	blocks, err := w.blocks()
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 6 {
		t.Fatalf("%d blocks after six pods of blocks of 4 on each of three nodes, want 6: %v", len(blocks), blockNames(blocks))
	}
	// ld-n1's blocks, by name and UID; blocks it claims later join.
	held := map[string]types.UID{}
	for _, b := range blocks {
		if b.NodeName == n1.Name {
			held[b.Name] = b.UID
		}
	}

	// check reads one moment of the cluster (no ADD or DEL in flight).
	check := func(live []*node, n1Running bool) {
		freeze.Lock()
		mu.Lock()
		var read []*pod
		for _, p := range pods {
			if nodeIn(p.node, live) {
				read = append(read, p)
			}
		}
		mu.Unlock()
		seenPods, err := readPods(read)
		var blocks []skeinv1.AddressBlock
		if err == nil {
			blocks, err = w.blocks()
		}
		var exports []string
		if err == nil {
			exports, err = exportProblems(live, blocks)
		}
		freeze.Unlock()
		if err != nil {
			found.add(err.Error())
			return
		}
		found.add(podProblems(seenPods, blocks, o.poolOf)...)
		found.add(BlockProblems(blocks)...)
		found.add(exports...)
		if !n1Running {
			return
		}
		now := map[string]*skeinv1.AddressBlock{}
		for i := range blocks {
			now[blocks[i].Name] = &blocks[i]
		}
		for name, uid := range held {
			switch b := now[name]; {
			case b == nil:
				found.add(fmt.Sprintf("block %s of %s, whose skeind runs, was deleted", name, n1.Name))
			case b.UID != uid:
				found.add(fmt.Sprintf("block %s of %s, whose skeind runs, was deleted and claimed again by node %q", name, n1.Name, b.NodeName))
			case !b.DeletionTimestamp.IsZero():
				found.add(fmt.Sprintf("block %s of %s, whose skeind runs, is being deleted (since %v)", name, n1.Name, b.DeletionTimestamp))
			}
		}
		for _, b := range blocks {
			if b.NodeName == n1.Name {
				held[b.Name] = b.UID
			}
		}
		l, err := w.lease(n1.Name)
		switch {
		case err != nil:
			found.add(err.Error())
		case l == nil:
			found.add(fmt.Sprintf("%s, whose skeind runs, has no Lease", n1.Name))
		case l.Spec.RenewTime == nil:
			found.add(fmt.Sprintf("the Lease of %s has no renewTime", n1.Name))
		default:
			r := l.Spec.RenewTime.Time
			if age := time.Since(r); age > ldLease {
				found.add(fmt.Sprintf("the Lease of %s, whose skeind runs, was last renewed %v ago (at %v): expired", n1.Name, age.Round(time.Millisecond), r))
			}
		}
	}
	check(w.nodes, true)

	out, err := w.env.Kubectl("delete", "node", n1.Name)
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	t.Logf("%s", strings.TrimSpace(string(out)))

	// Every node ADDs a pod a second; ld-n1 also DELs one every third.
	// An ADD refused because the pool is exhausted (code 100) is what
	// the other nodes must get once the two free blocks are gone; any
	// other failure is a defect. A failed ADD is DELed, as a kubelet does.
	exhausted := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), ldWatch)
	defer cancel()
	for _, n := range w.nodes {
		nss := podNS(int(ldWatch/time.Second) + 1)
		wg.Go(func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for i, ns := range nss {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				id := fmt.Sprintf("%s-b%d", n.Name, i)
				freeze.RLock()
				p, err := n.add(ns, "apps", id)
				if err == nil {
					mu.Lock()
					pods = append(pods, p)
					mu.Unlock()
				} else {
					if skeintest.ErrCode(err) == cni.CodePoolExhausted {
						mu.Lock()
						exhausted[n.Name]++
						mu.Unlock()
					} else {
						found.add(err.Error())
					}
					if derr := n.del(ns, "apps", id); derr != nil {
						found.add("after a failed ADD: " + derr.Error())
					}
				}
				if n == n1 && i%3 == 2 {
					found.add(delOne(&mu, &pods, n)...)
				}
				freeze.RUnlock()
			}
		})
	}
	for ctx.Err() == nil {
		time.Sleep(time.Second)
		check(w.nodes, true)
	}
	wg.Wait()
	found.report(t, fmt.Sprintf("while %s's Node was deleted and its skeind ran (%v)", n1.Name, time.Since(deleted).Round(time.Second)))
	mu.Lock()
	t.Logf("ADDs refused for an exhausted pool: %v; pods: %d", exhausted, len(pods))
	if exhausted["ld-n2"]+exhausted["ld-n3"] == 0 {
		t.Errorf("ld-n2 and ld-n3 never ran out of addresses: the test did not make them want ld-n1's blocks")
	}
	mu.Unlock()
	if v := kubenode.Sample(t, w.ctrls[0].Metrics, "skein_gc_deferred_total"); v == "" || v == "0" {
		t.Errorf("skein_gc_deferred_total is %q: the controller never looked at the deleted Node %s, so its keeping the blocks proves nothing", v, n1.Name)
	}
	if t.Failed() {
		t.FailNow()
	}

	// ld-n1 goes for real: its blocks and Lease go, once its Lease has
	// run out and the grace has passed — not before.
	n1.D.Kill(t)
	killed := time.Now()
	l, err := w.lease(n1.Name)
	if err != nil || l == nil || l.Spec.RenewTime == nil {
		t.Fatalf("the Lease of %s after its skeind was killed: %v, %v", n1.Name, l, err)
	}
	notBefore := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	blocks, err = w.blocks()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		if b.NodeName == n1.Name && b.CreationTimestamp.After(notBefore) {
			notBefore = b.CreationTimestamp.Time // a node claims blocks only while it runs
		}
	}
	notBefore = notBefore.Add(ldGrace)
	kubenode.Eventually(t, 45*time.Second, "the blocks and Lease of "+n1.Name+" gone", func() string {
		blocks, err := w.blocks()
		if err != nil {
			return err.Error()
		}
		var left []string
		for _, b := range blocks {
			if b.NodeName == n1.Name {
				left = append(left, b.Name)
			}
		}
		l, err := w.lease(n1.Name)
		switch {
		case err != nil:
			return err.Error()
		case len(left) > 0 || l != nil:
			return fmt.Sprintf("blocks %v, Lease %v", left, l != nil)
		}
		return ""
	})
	if gone := time.Now(); gone.Before(notBefore) {
		t.Errorf("the blocks of %s were taken at %v, before its Lease (renewed at %v, %v) and the grace (%v) had passed (%v)",
			n1.Name, gone, l.Spec.RenewTime.Time, ldLease, ldGrace, notBefore)
	}
	t.Logf("%s's blocks and Lease were taken back within %v of its skeind's kill, %v after its last renewal (Lease %v, grace %v)",
		n1.Name, time.Since(killed).Round(100*time.Millisecond), time.Since(l.Spec.RenewTime.Time).Round(100*time.Millisecond), ldLease, ldGrace)

	// Its blocks are the others' to claim now.
	for _, n := range others {
		ns := harness.NewNS(t, "pod")
		p, err := n.add(ns, "apps", n.Name+"-c")
		if err != nil {
			t.Errorf("ADD on %s once %s's blocks were taken back: %v", n.Name, n1.Name, err)
			continue
		}
		pods = append(pods, p)
	}
	check(others, false)
	found.report(t, "after "+n1.Name+" was gone")
}

// delOne DELs the oldest pod of n (it leaves the list first).
func delOne(mu *sync.Mutex, pods *[]*pod, n *node) []string {
	mu.Lock()
	var victim *pod
	for i, p := range *pods {
		if p.node == n {
			victim = p
			*pods = append((*pods)[:i:i], (*pods)[i+1:]...)
			break
		}
	}
	mu.Unlock()
	if victim == nil {
		return nil
	}
	if err := n.del(victim.ns, victim.namespace, victim.id); err != nil {
		return []string{err.Error()}
	}
	return nil
}

func nodeIn(n *node, nodes []*node) bool {
	for _, m := range nodes {
		if m == n {
			return true
		}
	}
	return false
}

func blockNames(blocks []skeinv1.AddressBlock) []string {
	var out []string
	for _, b := range blocks {
		out = append(out, b.Name+"("+b.NodeName+")")
	}
	return out
}

package cluster

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
)

var (
	churnSeed = flag.Uint64("churn.seed", 0, "TestChurn: seed of the workers' and the killer's choices (0: from the clock); the timing is the machine's")
	churnFor  = flag.Duration("churn.for", 60*time.Second, "TestChurn: how long pods come and go while processes are killed")
)

// Shape of TestChurn.
const (
	churnWorkers = 3 // per node, each ADDing and DELing pods in its own slots
	churnSlots   = 4 // pod namespaces per worker: at most that many of its pods at once
	churnLease   = 4 * time.Second
	churnMinAge  = time.Second // skeind --block-min-age: empty blocks go back quickly
)

// TestChurn is a cluster under crash churn: three skeind nodes (each with
// its own node's identity under the shipped RBAC and policies) and two
// skein-controller replicas, pools of blocks of 4 addresses (so nodes
// claim and give back blocks all the time), workers ADDing and DELing
// pods on every node for -churn.for while skeinds are SIGKILLed and
// restarted and the leading controller is SIGKILLed.
//
// Every second (ADDs and DELs held for the moment) it reads every pod
// namespace's eth0 and every AddressBlock and fails on: an address on
// two pod namespaces at once; a live pod whose eth0 lacks what its ADD
// gave, or whose address is not in a block of its node and its
// namespace's pool; two blocks that overlap or break the naming rule; a
// BlockRequest; a node exporting a block another node owns (seen twice
// in a row). An ADD or DEL that fails while its node's skeind was up all
// along fails the test (a killed controller must not matter to them).
//
// After the churn every pod is DELed, and then each node's skeind must
// hold no attachment and count no address used, no veth may be left on
// either side, each node namespace must be as it was at start, and the
// AddressBlocks must be exactly one spare block of the default pool per
// node and none of the other pool.
func TestChurn(t *testing.T) {
	harness.RequireRoot(t)
	seed := *churnSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d: go test -run TestChurn ./test/cluster/ -args -churn.seed=%d chooses the same", seed, seed)
	o := worldOptions{
		nodes: []string{"ch-n1", "ch-n2", "ch-n3"},
		pools: []skeinv1.AddressPool{
			{
				ObjectMeta: metav1.ObjectMeta{Name: skeinv1.DefaultPool},
				Spec: skeinv1.AddressPoolSpec{BlockSizeBits: 2,
					Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.150.0.0/24"), IPv6: ptr.To("fd00:150::/120")}}},
			},
			{
				ObjectMeta: metav1.ObjectMeta{Name: "other"},
				Spec:       skeinv1.AddressPoolSpec{BlockSizeBits: 2, Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.151.0.0/25")}}},
			},
		},
		namespaces:  map[string]string{"plain": "", "team": "other"},
		skeind:      []string{"--lease-duration", churnLease.String(), "--block-min-age", churnMinAge.String()},
		controller:  []string{"--node-gc-grace", "3s"},
		controllers: 2,
	}
	began := time.Now()
	w := startWorld(t, o)
	c := &churn{w: w, o: o, found: &problems{start: time.Now()}}
	base := map[*node]harness.State{}
	for _, n := range w.nodes {
		base[n] = n.D.NodeState(t)
		for wi := range churnWorkers {
			var slots []*slot
			for range churnSlots {
				slots = append(slots, &slot{ns: harness.NewNS(t, "pod"), node: n})
			}
			c.slots = append(c.slots, slots...)
			c.workers = append(c.workers, &worker{c: c, n: n, name: fmt.Sprintf("%s-w%d", n.Name, wi), slots: slots,
				rng: rand.New(rand.NewPCG(seed, uint64(len(c.workers)+1)))})
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// However the test ends, the workers stop before the cleanups run.
	defer func() { cancel(); wg.Wait() }()
	for _, wk := range c.workers {
		wg.Go(func() { wk.run(ctx) })
	}
	wg.Go(func() { c.checkEvery(ctx, time.Second) })
	kills := c.chaos(t, rand.New(rand.NewPCG(seed, 0)), *churnFor)
	cancel()
	wg.Wait()
	c.check() // the pods as the churn left them
	c.found.report(t, "during the churn")
	c.blockMu.Lock()
	claimed, released := len(c.blockUIDs), len(c.released)
	c.blockMu.Unlock()
	t.Logf("churn: %v; %s; %s; %d checks saw %d blocks claimed, %d given back", *churnFor, kills, c.stats(), c.checks.Load(), claimed, released)
	if t.Failed() {
		t.FailNow()
	}
	if c.checks.Load() < int64(*churnFor/(3*time.Second)) {
		t.Errorf("only %d checks ran in %v of churn: the invariants were not watched", c.checks.Load(), *churnFor)
	}
	if c.addOK.Load() < 100 {
		t.Errorf("only %d ADDs succeeded in %v of churn", c.addOK.Load(), *churnFor)
	}
	if claimed < 10 || released < 10 {
		t.Errorf("the checks saw %d blocks claimed and %d given back: the churn did not make nodes claim and release blocks", claimed, released)
	}

	c.drainAll(t)
	c.found.report(t, "deleting every pod")
	c.final(t, base)
	t.Logf("TestChurn took %v", time.Since(began).Round(time.Second))
}

// churn is the state TestChurn's workers, checker and killer share.
type churn struct {
	w       *world
	o       worldOptions
	slots   []*slot
	workers []*worker
	found   *problems

	// mu guards the slots' pods; freeze is held (read) by every ADD and
	// DEL, and taken by a check so that it reads one moment.
	mu     sync.Mutex
	freeze sync.RWMutex

	addOK, addFailed, delOK, delFailed, checks atomic.Int64

	// Blocks the checks have seen (by UID) and those seen to go.
	blockMu   sync.Mutex
	blockUIDs map[types.UID]string
	released  map[types.UID]bool
	// Export violations of the previous check: reported when seen again.
	lastExports map[string]bool
}

// slot is a pod network namespace of one worker: empty, holding a live
// pod (its ADD succeeded, no DEL yet), or holding a pending one (its ADD
// failed, or its DEL has not succeeded yet: what may be left in the
// namespace is the DEL's to remove).
type slot struct {
	ns            *harness.NS
	node          *node
	live, pending *pod
}

type worker struct {
	c     *churn
	n     *node
	name  string
	slots []*slot
	rng   *rand.Rand
	seq   int
}

// run ADDs into an empty slot or DELs a full one, chosen at random, until
// ctx ends. 30% of the pods are in namespace team (pool other).
func (wk *worker) run(ctx context.Context) {
	c := wk.c
	for ctx.Err() == nil {
		s := wk.slots[wk.rng.IntN(len(wk.slots))]
		c.mu.Lock()
		p := s.live
		c.mu.Unlock()
		if p == nil {
			namespace := "plain"
			if wk.rng.IntN(10) < 3 {
				namespace = "team"
			}
			wk.seq++
			wk.add(s, namespace, fmt.Sprintf("%s-%d", wk.name, wk.seq))
		} else {
			c.mu.Lock()
			s.live, s.pending = nil, p
			c.mu.Unlock()
			c.drain(s, time.Minute)
		}
		time.Sleep(time.Duration(wk.rng.IntN(100)) * time.Millisecond)
	}
}

// add ADDs a pod into s; a failed ADD is DELed until that succeeds.
func (wk *worker) add(s *slot, namespace, id string) {
	c, n := wk.c, wk.n
	c.freeze.RLock()
	life, up := n.state()
	p, err := n.add(s.ns, namespace, id)
	after, _ := n.state()
	c.mu.Lock()
	if err == nil {
		s.live = p
	} else {
		s.pending = &pod{id: id, namespace: namespace, node: n, ns: s.ns}
	}
	c.mu.Unlock()
	c.freeze.RUnlock()
	if err == nil {
		c.addOK.Add(1)
		return
	}
	c.addFailed.Add(1)
	if up && life == after {
		c.found.add(fmt.Sprintf("%v (skeind on %s was up all along)", err, n.Name))
	}
	c.drain(s, time.Minute)
}

// drain DELs s's pending pod until the DEL succeeds or within has passed.
func (c *churn) drain(s *slot, within time.Duration) {
	c.mu.Lock()
	p := s.pending
	c.mu.Unlock()
	if p == nil {
		return
	}
	deadline := time.Now().Add(within)
	for {
		c.freeze.RLock()
		life, up := p.node.state()
		err := p.node.del(s.ns, p.namespace, p.id)
		after, _ := p.node.state()
		if err == nil {
			c.mu.Lock()
			s.pending = nil
			c.mu.Unlock()
		}
		c.freeze.RUnlock()
		if err == nil {
			c.delOK.Add(1)
			return
		}
		c.delFailed.Add(1)
		if up && life == after {
			c.found.add(fmt.Sprintf("%v (skeind on %s was up all along)", err, p.node.Name))
		}
		if time.Now().After(deadline) {
			c.found.add(fmt.Sprintf("DEL %s/%s on %s still fails after %v: %v", p.namespace, p.id, p.node.Name, within, err))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *churn) stats() string {
	return fmt.Sprintf("ADDs %d ok, %d failed (skeind killed under them); DELs %d ok, %d failed and retried",
		c.addOK.Load(), c.addFailed.Load(), c.delOK.Load(), c.delFailed.Load())
}

// checkEvery runs check every period until ctx ends.
func (c *churn) checkEvery(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.check()
	}
}

// check reads one moment of the cluster — every slot's eth0, every
// AddressBlock and BlockRequest, every node's export table — with no ADD
// or DEL in flight, and records what breaks the invariants.
func (c *churn) check() {
	c.freeze.Lock()
	c.mu.Lock()
	var live, pending []*pod
	for _, s := range c.slots {
		if s.live != nil {
			live = append(live, s.live)
		}
		if s.pending != nil {
			pending = append(pending, s.pending)
		}
	}
	c.mu.Unlock()
	seenLive, err := readPods(live)
	var seenPending []seen
	if err == nil {
		seenPending, err = readPods(pending)
	}
	var blocks []skeinv1.AddressBlock
	if err == nil {
		blocks, err = c.w.blocks()
	}
	var reqs []skeinv1.BlockRequest
	if err == nil {
		reqs, err = c.w.requests()
	}
	var exports []string
	if err == nil {
		exports, err = exportProblems(c.w.nodes, blocks)
	}
	c.freeze.Unlock()
	c.checks.Add(1)
	if err != nil {
		c.found.add("check: " + err.Error())
		return
	}
	c.found.add(podProblems(seenLive, blocks, c.o.poolOf)...)
	// What a pending pod's namespace still holds is not live, but no
	// address may be in two namespaces at once even so: skeind hands out
	// an address again only once its record and link are gone.
	on := map[netip.Addr]*pod{}
	for _, s := range seenLive {
		for _, a := range s.addrs {
			on[a] = s.pod
		}
	}
	for _, s := range seenPending {
		for _, a := range s.addrs {
			if q, dup := on[a]; dup {
				c.found.add(fmt.Sprintf("address %s is in two pod namespaces at once: %s and %s (its ADD failed or its DEL is not done)", a, q, s.pod))
			}
			on[a] = s.pod
		}
	}
	c.found.add(BlockProblems(blocks)...)
	for _, r := range reqs {
		c.found.add(fmt.Sprintf("BlockRequest %s (node %q, pool %q) exists: nothing may make them any more", r.Name, r.Spec.NodeName, r.Spec.PoolName))
	}
	// A block given back by one node and claimed at once by another may
	// be in the first one's table for a moment: a route is a violation
	// when the next check still sees it.
	now := map[string]bool{}
	for _, e := range exports {
		now[e] = true
		if c.lastExports[e] {
			c.found.add(e + " (in two checks in a row)")
		}
	}
	c.lastExports = now
	c.blockMu.Lock()
	defer c.blockMu.Unlock()
	if c.blockUIDs == nil {
		c.blockUIDs, c.released = map[types.UID]string{}, map[types.UID]bool{}
	}
	present := map[types.UID]bool{}
	for _, b := range blocks {
		present[b.UID] = true
		c.blockUIDs[b.UID] = b.Name
	}
	for uid := range c.blockUIDs {
		if !present[uid] {
			c.released[uid] = true
		}
	}
}

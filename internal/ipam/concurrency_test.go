package ipam

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"

	"github.com/skeinnet/skein/internal/store"
)

// holdings records who holds each address; a second holder is a bug.
type holdings struct {
	mu   sync.Mutex
	held map[netip.Addr]string
}

func (h *holdings) take(t *testing.T, who string, as []netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range as {
		if prev, dup := h.held[a]; dup {
			t.Errorf("%v handed to %s while held by %s", a, who, prev)
		}
		h.held[a] = who
	}
}

func (h *holdings) give(as []netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range as {
		delete(h.held, a)
	}
}

// churn runs workers goroutines that allocate from pools and release,
// keeping up to keep addresses each, and checks no address is held twice.
func churn(t *testing.T, ms []*Manager, pools []string, requests []Request, workers, ops, keep int) *holdings {
	ctx := context.Background()
	h := &holdings{held: map[netip.Addr]string{}}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			m := ms[w%len(ms)]
			type lease struct {
				pool  string
				addrs []netip.Addr
			}
			var mine []lease
			for i := range ops {
				if len(mine) >= keep || (len(mine) > 0 && rng.IntN(2) == 0) {
					k := rng.IntN(len(mine))
					l := mine[k]
					mine = append(mine[:k], mine[k+1:]...)
					h.give(l.addrs) // before Release: the address may be reissued at once
					m.Release(ctx, l.pool, l.addrs)
					continue
				}
				r := requests[rng.IntN(len(requests))]
				r.Pool = pools[rng.IntN(len(pools))]
				got, err := m.Allocate(ctx, r)
				if errors.Is(err, ErrExhausted) {
					continue
				}
				if err != nil {
					t.Errorf("worker %d op %d: %v", w, i, err)
					return
				}
				h.take(t, fmt.Sprintf("worker %d", w), got)
				mine = append(mine, lease{r.Pool, got})
			}
			for _, l := range mine {
				h.give(l.addrs)
				m.Release(ctx, l.pool, l.addrs)
			}
		}()
	}
	wg.Wait()
	return h
}

func TestConcurrentOnePool(t *testing.T) {
	// 32 workers keeping up to 8 addresses each in a pool of 254: blocks
	// are claimed while others allocate, and the pool runs out at times.
	m, _ := setup(t, []string{"10.0.0.0/24", "fd00::/64"}, 0)
	reqs := []Request{{}, {IPv4: true}, {IPv6: true}, {Within: prefixes("10.0.0.64/26")}}
	h := churn(t, []*Manager{m}, []string{"p"}, reqs, 32, 300, 8)
	if len(h.held) != 0 {
		t.Fatalf("%d addresses still recorded", len(h.held))
	}
	if u := usage(t, m, "p"); u.Used != 0 {
		t.Fatalf("used %d after every release", u.Used)
	}
}

func TestConcurrentManyPools(t *testing.T) {
	st := openStore(t)
	m := newManager(t, st, "n1")
	var pools []string
	for i := range 6 {
		name := fmt.Sprintf("p%d", i)
		createPool(t, m, name, []string{fmt.Sprintf("10.%d.0.0/25", i), fmt.Sprintf("fd00:%d::/64", i)}, 0)
		pools = append(pools, name)
	}
	churn(t, []*Manager{m}, pools, []Request{{}, {IPv6: true}, {IPv4: true}}, 32, 300, 6)
	for _, p := range pools {
		if u := usage(t, m, p); u.Used != 0 {
			t.Fatalf("%s: used %d after every release", p, u.Used)
		}
	}
}

func TestConcurrentNodes(t *testing.T) {
	// Four nodes share one store: blocks, not addresses, are the unit they
	// contend for, and ranged claims race through claimWithin.
	_, st := setup(t, []string{"10.0.0.0/23"}, 0)
	var ms []*Manager
	for i := range 4 {
		ms = append(ms, newManager(t, st, fmt.Sprintf("n%d", i)))
	}
	churn(t, ms, []string{"p"}, []Request{{}, {Within: prefixes("10.0.1.0/24")}}, 32, 200, 5)
	bs, err := st.ListBlocks(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[uint32]string{}
	for _, b := range bs {
		if prev, dup := owners[b.Index]; dup {
			t.Fatalf("block %d owned by %s and %s", b.Index, prev, b.Node)
		}
		owners[b.Index] = b.Node
	}
}

// TestCrashRestore allocates, records attachments, drops the manager and
// the store as a crash would, and rebuilds from the file.
func TestCrashRestore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "skein.db")
	st, err := store.OpenBolt(path, store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(t, st, "n1")
	createPool(t, m, "p", []string{"10.0.0.0/24", "fd00::/64"}, 0)
	createPool(t, m, "q", []string{"10.1.0.0/24"}, 0)
	held := map[netip.Addr]bool{}
	put := func(m *Manager, st store.Store, pool string, n, from int) {
		t.Helper()
		for i := range n {
			got := mustAllocate(t, m, Request{Pool: pool})
			for _, a := range got {
				if held[a] {
					t.Fatalf("%v handed out twice", a)
				}
				held[a] = true
			}
			att := store.Attachment{
				AttachmentKey: store.AttachmentKey{Network: pool, ContainerID: fmt.Sprintf("c%d", from+i), IfName: "eth0"},
				Pool:          pool,
				Addrs:         got,
			}
			if err := st.PutAttachment(ctx, att); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(m, st, "p", 70, 0)
	put(m, st, "q", 20, 0)
	// Some were released (and their attachments deleted) before the crash.
	for i := 0; i < 70; i += 7 {
		k := store.AttachmentKey{Network: "p", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}
		a, err := st.GetAttachment(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		m.Release(ctx, "p", a.Addrs)
		if err := st.DeleteAttachment(ctx, k); err != nil {
			t.Fatal(err)
		}
		for _, x := range a.Addrs {
			delete(held, x)
		}
	}
	// Crash: the manager is gone, the file stays.
	m = nil
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, err = store.OpenBolt(path, store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m = newManager(t, st, "n1")
	if err := m.LoadAll(ctx); err != nil {
		t.Fatal(err)
	}
	atts, err := st.ListAttachments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range atts {
		if err := m.Restore(ctx, a.Pool, a.Addrs); err != nil {
			t.Fatal(err)
		}
	}
	if u := usage(t, m, "p"); u.Used != 2*60 || u.Blocks != 3 {
		t.Fatalf("p after restore: %+v", u)
	}
	if u := usage(t, m, "q"); u.Used != 20 {
		t.Fatalf("q after restore: %+v", u)
	}
	put(m, st, "p", 100, 100)
	put(m, st, "q", 254-20, 100)
	if _, err := m.Allocate(ctx, Request{Pool: "q"}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("q should be full: %v", err)
	}
}

func TestLowestFree(t *testing.T) {
	tests := []struct {
		ranges []indexRange
		taken  []uint32
		want   uint32
		ok     bool
	}{
		{[]indexRange{{0, 8}}, nil, 0, true},
		{[]indexRange{{0, 8}}, []uint32{0, 1, 2, 5}, 3, true},
		{[]indexRange{{4, 8}}, []uint32{0, 4, 5, 6, 7}, 0, false},
		{[]indexRange{{4, 8}, {1, 3}}, []uint32{1, 4}, 2, true},
		{[]indexRange{{4, 8}, {1, 3}}, []uint32{1, 2, 4}, 5, true},
		{[]indexRange{{1 << 31, 1<<32 - 1}}, []uint32{0, 1 << 31}, 1<<31 + 1, true},
		{nil, nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := lowestFree(tt.ranges, tt.taken)
		if got != tt.want || ok != tt.ok {
			t.Errorf("lowestFree(%v, %v) = %d, %v; want %d, %v", tt.ranges, tt.taken, got, ok, tt.want, tt.ok)
		}
	}
}

// BenchmarkAllocateRelease allocates and releases from one dual-stack pool
// on every CPU at once. Blocks are claimed in the first iterations only;
// after that it measures the in-memory path and the pool lock.
func BenchmarkAllocateRelease(b *testing.B) {
	ctx := context.Background()
	m, _ := setup(b, []string{"10.0.0.0/16", "fd00::/64"}, 0)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			got, err := m.Allocate(ctx, Request{Pool: "p"})
			if err != nil {
				b.Error(err)
				return
			}
			m.Release(ctx, "p", got)
		}
	})
}

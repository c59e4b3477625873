package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/skeinnet/skein/internal/store"
)

// granting is a store whose blocks an allocator elsewhere chooses (as
// skein-controller does in Kubernetes mode): GrantBlock hands out the
// lowest free index, whatever is reserved in it, or fails with err.
type granting struct {
	*store.Bolt
	grants atomic.Int32
	err    error
}

var _ BlockGranter = (*granting)(nil)

func (g *granting) GrantBlock(ctx context.Context, pool, node string) (store.Block, error) {
	if g.err != nil {
		return store.Block{}, g.err
	}
	g.grants.Add(1)
	return g.ClaimBlock(ctx, pool, node, 1<<20, nil, nil)
}

func grantingSetup(t *testing.T, subnets []string, bits int, reserved ...string) (*Manager, *granting, *atomic.Int32) {
	t.Helper()
	g := &granting{Bolt: openStore(t)}
	changes := &atomic.Int32{}
	m, err := NewManager(Options{Store: g, Node: "n1", OnBlocksChanged: func() { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	createPool(t, m, "p", subnets, bits, reserved...)
	return m, g, changes
}

func blocksOf(t *testing.T, st store.Store) []uint32 {
	t.Helper()
	bs, err := st.ListBlocks(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for _, b := range bs {
		out = append(out, b.Index)
	}
	return out
}

// A granted block with no usable address (all reserved) is kept — given
// back, the allocator would grant it again — and another is asked for.
func TestGrantSkipsFullyReservedBlock(t *testing.T) {
	m, g, _ := grantingSetup(t, []string{"10.0.0.0/29"}, 1, "10.0.0.0-10.0.0.1")
	got := mustAllocate(t, m, Request{Pool: "p"})
	if want := addrs("10.0.0.2"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	if n := g.grants.Load(); n != 2 {
		t.Errorf("%d grants, want 2 (the reserved block, then one with room)", n)
	}
	if b := blocksOf(t, g); fmt.Sprint(b) != "[0 1]" {
		t.Errorf("blocks %v, want [0 1]: the reserved block is kept", b)
	}
}

// With a granter, releasing a block's last address frees the block and
// tells OnBlocksChanged; a block still holding an address is kept.
func TestGrantReleaseFreesEmptyBlock(t *testing.T) {
	ctx := context.Background()
	m, g, changes := grantingSetup(t, []string{"10.0.0.0/24"}, 2)
	a := mustAllocate(t, m, Request{Pool: "p"})
	b := mustAllocate(t, m, Request{Pool: "p"})
	before := changes.Load()
	m.Release(ctx, "p", a)
	if bs := blocksOf(t, g); len(bs) != 1 {
		t.Fatalf("blocks %v after releasing one of two addresses, want the block kept", bs)
	}
	m.Release(ctx, "p", b)
	if bs := blocksOf(t, g); len(bs) != 0 {
		t.Fatalf("blocks %v after releasing the last address, want none", bs)
	}
	if changes.Load() == before {
		t.Error("OnBlocksChanged not called when the block was freed")
	}
	if u, _ := m.Usage(ctx, "p"); u.Blocks != 0 {
		t.Errorf("usage counts %d blocks, want 0", u.Blocks)
	}
	// The next allocation is granted a block again.
	mustAllocate(t, m, Request{Pool: "p"})
	if n := g.grants.Load(); n != 2 {
		t.Errorf("%d grants, want 2", n)
	}
}

// The embedded store keeps a node's blocks: releasing the last address
// does not free it, nor does FreeUnusedBlocks.
func TestNoGranterKeepsBlocks(t *testing.T) {
	ctx := context.Background()
	m, st := setup(t, []string{"10.0.0.0/24"}, 2)
	a := mustAllocate(t, m, Request{Pool: "p"})
	m.Release(ctx, "p", a)
	if n, err := m.FreeUnusedBlocks(ctx); n != 0 || err != nil {
		t.Errorf("FreeUnusedBlocks = %d, %v; want 0, nil", n, err)
	}
	if bs := blocksOf(t, st); len(bs) != 1 {
		t.Errorf("blocks %v, want the one block kept", bs)
	}
}

// On start, after Restore, FreeUnusedBlocks gives back the blocks no
// attachment uses and keeps the others.
func TestFreeUnusedBlocks(t *testing.T) {
	ctx := context.Background()
	m, g, _ := grantingSetup(t, []string{"10.0.0.0/24"}, 2)
	var all []netip.Addr
	for range 9 { // blocks 0, 1 and 2 (4 addresses each)
		all = append(all, mustAllocate(t, m, Request{Pool: "p"})...)
	}
	// A new manager (skeind restarted) restores one address of block 1.
	m2, err := NewManager(Options{Store: g, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.LoadAll(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m2.Restore(ctx, "p", all[5:6]); err != nil {
		t.Fatal(err)
	}
	n, err := m2.FreeUnusedBlocks(ctx)
	if err != nil || n != 2 {
		t.Fatalf("FreeUnusedBlocks = %d, %v; want 2 freed", n, err)
	}
	if bs := blocksOf(t, g); fmt.Sprint(bs) != "[1]" {
		t.Errorf("blocks %v, want [1]", bs)
	}
}

// A grant that fails leaves nothing held, and its error is the caller's
// to branch on.
func TestGrantFailure(t *testing.T) {
	ctx := context.Background()
	m, g, _ := grantingSetup(t, []string{"10.0.0.0/24"}, 2)
	g.err = fmt.Errorf("no answer: %w", ErrTryAgain)
	if _, err := m.Allocate(ctx, Request{Pool: "p"}); !errors.Is(err, ErrTryAgain) {
		t.Fatalf("allocate: %v, want ErrTryAgain", err)
	}
	if bs := blocksOf(t, g); len(bs) != 0 {
		t.Errorf("blocks %v after a failed grant", bs)
	}
	if u, _ := m.Usage(ctx, "p"); u.Blocks != 0 || u.Used != 0 {
		t.Errorf("usage %+v, want nothing held", u)
	}
}

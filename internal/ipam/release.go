package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// release clears addrs in ps (an address reserved meanwhile stays used,
// as a reservation); the caller holds ps.mu. A block left empty is marked
// so (giveBack), and a lost one is forgotten.
func (ps *poolState) release(addrs []netip.Addr) {
	for _, a := range addrs {
		a = a.Unmap()
		delete(ps.stale, a)
		bi, off, ok := ps.geo.Locate(a)
		if !ok {
			continue
		}
		b := ps.blocks[bi]
		if b == nil {
			continue
		}
		bm, rsv := b.v4, b.rsv4
		if a.Is6() {
			bm, rsv = b.v6, b.rsv6
		}
		if bm == nil || !bm.test(off) || rsv.test(off) {
			continue // free, or a reservation: not an attachment's
		}
		if ps.geo.Reserved(a) {
			rsv.set(off) // reserved since it was handed out
		} else {
			bm.clear(off)
		}
		if b.held() == 0 {
			b.emptySince = time.Now()
			if b.lost {
				ps.dropBlock(bi)
			}
		}
	}
}

// Release frees addrs of pool. Unknown pools and addresses are ignored:
// release is idempotent.
func (m *Manager) Release(ctx context.Context, pool string, addrs []netip.Addr) {
	ps, err := m.pool(ctx, pool)
	if err != nil {
		return
	}
	ps.mu.Lock()
	ps.release(addrs)
	ps.lastUsed = time.Now()
	m.unlock(ps)
	m.kick(pool) // a block may be empty now (Run gives it back in time)
}

func (b *blockState) inUse() bool { return b.held() > 0 }

// FreeUnusedBlocks runs on start, after Restore, with a ClusterStore:
// blocks a crash left claimed but unused go back to the cluster (keeping
// a spare for each pool in use), and the default pool gets its spare
// before the node serves its first pod. It returns how many blocks it
// gave back. Without a ClusterStore it does nothing (the embedded store
// keeps a node's blocks).
func (m *Manager) FreeUnusedBlocks(ctx context.Context) (int, error) {
	if m.cluster == nil {
		return 0, nil
	}
	return m.tend(ctx, true)
}

// Restore marks addresses of an existing attachment used, on start. The
// block must be this node's (claimed for it if free). Addresses held
// already give a *DupError once the others are restored.
func (m *Manager) Restore(ctx context.Context, pool string, addrs []netip.Addr) error {
	ps, err := m.pool(ctx, pool)
	if err != nil {
		return err
	}
	ps.mu.Lock()
	defer m.unlock(ps)
	var dup []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		bi, off, ok := ps.geo.Locate(a)
		if !ok {
			return fmt.Errorf("%w: %v is not in pool %q", ErrOutOfPool, a, pool)
		}
		b := ps.blocks[bi]
		if b == nil {
			if _, err := m.st.ClaimBlock(ctx, pool, m.node, ps.geo.Blocks(), &bi, nil); err != nil {
				return fmt.Errorf("restore %v: %w", a, err)
			}
			b = ps.addBlock(bi)
			ps.claimed = true
		}
		bm := b.v4
		if a.Is6() {
			bm = b.v6
		}
		if !b.hold(a, off) {
			dup = append(dup, a)
		}
		// Start the search after the highest restored offset so freshly
		// freed addresses are not the first handed out after a restart.
		// The cursor is not wrapped here (next wraps it): wrapping would
		// let a lower offset restored later pull it back.
		if off+1 > bm.cursor {
			bm.cursor = off + 1
		}
	}
	if len(dup) > 0 {
		return &DupError{Addrs: dup}
	}
	return nil
}

// DupError is Restore's error for addresses that were held already; it
// wraps ErrInUse. The other addresses of the call were restored.
type DupError struct {
	Addrs []netip.Addr
}

func (e *DupError) Error() string {
	return fmt.Sprintf("%v: %v restored twice (two records hold it)", ErrInUse, e.Addrs)
}

func (e *DupError) Unwrap() error { return ErrInUse }

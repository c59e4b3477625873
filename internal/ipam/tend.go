package ipam

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/skeinnet/skein/internal/store"
)

// The background side of a Manager over a ClusterStore: Run tends each
// pool in use — follows its definition in the store, adopts blocks whose
// claim's answer was lost, keeps a spare block, gives back blocks empty
// for MinBlockAge.

// kick asks Run to look at pool soon.
func (m *Manager) kick(pool string) {
	if m.cluster == nil {
		return
	}
	m.dirtyMu.Lock()
	m.dirty[pool] = true
	m.dirtyMu.Unlock()
	select {
	case m.kickc <- struct{}{}:
	default:
	}
}

// Run keeps the node's blocks in shape with a ClusterStore until ctx
// ends: it follows pools (reserved edits, appended subnets, a pool
// re-created or deleted), drops blocks no longer provably this node's,
// adopts blocks of this node it did not know (a claim whose answer was
// lost), claims a spare block for each pool in use before its free
// addresses run out, and gives back blocks empty for MinBlockAge. It
// returns at once without a ClusterStore.
func (m *Manager) Run(ctx context.Context) {
	if m.cluster == nil {
		return
	}
	t := time.NewTicker(m.copts.Resync)
	defer t.Stop()
	var wasFenced error
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kickc:
		case <-t.C:
			m.dirtyMu.Lock()
			m.dirty[""] = true // everything
			m.dirtyMu.Unlock()
		}
		// The export follows the fence (ExportedBlocks) within a Resync.
		if err := m.fenced(); (err != nil) != (wasFenced != nil) {
			if err != nil {
				m.log.Error("this node may no longer be the owner of its blocks: it hands out no address and routes none of them until it can prove it again", "err", err)
			} else {
				m.log.Info("this node's blocks are its own again: addresses handed out and routed")
			}
			wasFenced = err
			m.changed()
		}
		if _, err := m.tend(ctx, false); err != nil && ctx.Err() == nil {
			m.log.Warn("blocks: tending the pools failed (retried at the next change, or in a few seconds)", "err", err)
		}
	}
}

// tend looks at the pools marked dirty (all of them for ""); startup
// ignores MinBlockAge. It returns how many blocks it gave back.
func (m *Manager) tend(ctx context.Context, startup bool) (int, error) {
	m.dirtyMu.Lock()
	dirty := m.dirty
	m.dirty = map[string]bool{}
	m.dirtyMu.Unlock()
	names := map[string]bool{}
	m.mu.RLock()
	for name := range m.pools {
		if dirty[""] || dirty[name] || startup {
			names[name] = true
		}
	}
	m.mu.RUnlock()
	if def := m.copts.DefaultPool; dirty[""] || dirty[def] || startup {
		names[def] = true // kept with a spare even before its first pod
	}
	for name := range dirty {
		if name != "" {
			names[name] = true
		}
	}
	freed := 0
	var errs []error
	for name := range names {
		n, err := m.tendPool(ctx, name, startup)
		freed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return freed, errors.Join(errs...)
}

// tendPool is tend for one pool.
func (m *Manager) tendPool(ctx context.Context, name string, startup bool) (int, error) {
	ps := m.loaded(name)
	if ps == nil {
		if name != m.copts.DefaultPool {
			return 0, nil // not used on this node
		}
		var err error
		if ps, err = m.pool(ctx, name); errors.Is(err, ErrPoolNotFound) {
			return 0, nil
		} else if err != nil {
			return 0, err
		}
	}
	if err := m.follow(ctx, ps); err != nil {
		return 0, err
	}
	if cur := m.loaded(name); cur != nil && cur != ps {
		ps = cur // re-created
	}
	var errs []error
	if err := m.adopt(ctx, ps); err != nil {
		errs = append(errs, err)
	}
	if err := m.spare(ctx, ps); err != nil {
		errs = append(errs, err)
	}
	freed, err := m.giveBack(ctx, ps, startup)
	return freed, errors.Join(append(errs, err)...)
}

// inUse reports whether ps should keep a spare block; the caller holds
// ps.mu.
func (m *Manager) inUse(ps *poolState) bool {
	if ps.deleting {
		return false
	}
	if ps.def.Name == m.copts.DefaultPool {
		return true
	}
	for _, b := range ps.blocks {
		if b.held() > 0 {
			return true
		}
	}
	return time.Since(ps.lastUsed) < m.copts.MinBlockAge
}

// spare claims a block for ps when the pool is in use and its free
// addresses are below the low-water mark.
func (m *Manager) spare(ctx context.Context, ps *poolState) error {
	ps.mu.Lock()
	need := m.inUse(ps) && ps.free() < ps.lowWater()
	v4, _ := ps.geo.Families()
	ps.mu.Unlock()
	if !need {
		return nil
	}
	err := m.claimFor(ctx, ps, &needBlock{v6: !v4, spare: true})
	if errors.Is(err, ErrExhausted) {
		return nil // nothing to be had; ADDs will say so
	}
	if err != nil {
		return fmt.Errorf("claim a spare block of pool %q: %w", ps.def.Name, err)
	}
	return nil
}

// giveBack releases the blocks of ps that hold no address and have been
// empty for MinBlockAge (any age at startup, or while the pool is being
// deleted), keeping what the pool needs to stay above its low-water mark
// while in use.
func (m *Manager) giveBack(ctx context.Context, ps *poolState, startup bool) (int, error) {
	freed := 0
	for {
		ps.mu.Lock()
		var victim *blockState
		keep := m.inUse(ps)
		for _, i := range ps.order {
			b := ps.blocks[i]
			if b.held() > 0 || b.releasing || b.lost {
				continue
			}
			old := startup || ps.deleting || time.Since(b.emptySince) >= m.copts.MinBlockAge
			if !old {
				continue
			}
			if keep && ps.free()-min(ps.free(), b.free()) < ps.lowWater() {
				continue // the pool's spare
			}
			victim = b
			break
		}
		if victim == nil {
			ps.mu.Unlock()
			return freed, nil
		}
		victim.releasing = true
		name, index := ps.def.Name, victim.index
		ps.mu.Unlock()

		err := m.st.ReleaseBlock(ctx, name, index, m.node)
		ps.mu.Lock()
		if err != nil {
			victim.releasing = false
			m.unlock(ps)
			return freed, fmt.Errorf("free block %d of pool %q: %w", index, name, err)
		}
		ps.dropBlock(index)
		ps.claimed = true
		m.unlock(ps)
		freed++
	}
}

// free is the free addresses of b in its scarcer family.
func (b *blockState) free() uint32 {
	f := ^uint32(0)
	if b.v4 != nil {
		f = min(f, b.v4.size-b.v4.used)
	}
	if b.v6 != nil {
		f = min(f, b.v6.size-b.v6.used)
	}
	return f
}

// adopt takes into ps the blocks the store says are this node's but ps
// does not hold (a claim whose answer never came back: the API server
// made the block, the client timed out), so that they are used or given
// back instead of leaking; and marks lost those it holds that the store
// no longer says are its own.
func (m *Manager) adopt(ctx context.Context, ps *poolState) error {
	blocks, err := m.cluster.NodeBlocks(ctx, ps.def.Name, m.node)
	if err != nil {
		return err
	}
	ps.mu.Lock()
	defer m.unlock(ps)
	for _, blk := range blocks {
		if blk.Node != m.node || blk.Index >= ps.geo.Blocks() || ps.blocks[blk.Index] != nil {
			continue
		}
		if !m.cluster.Owns(ps.def.Name, blk.Index, m.node) || ps.claiming[blk.Index] {
			continue // being deleted; or being claimed right now (claimFor adds it)
		}
		b := ps.addBlock(blk.Index)
		b.emptySince = time.Now()
		ps.claimed = true
		m.log.Info("adopted a block of this node it did not know (a claim whose answer was lost)", "pool", ps.def.Name, "block", blk.Index)
	}
	for _, i := range slices.Clone(ps.order) {
		m.usable(ps, ps.blocks[i]) // marks the lost ones
	}
	return nil
}

// follow brings ps in step with the pool's definition in the store: a
// reserved list edited applies to every block at once; subnets appended
// extend the geometry; a pool deleted stops claims (and gives its empty
// blocks back at once); a pool re-created under the same name (another
// UID) replaces ps.
func (m *Manager) follow(ctx context.Context, ps *poolState) error {
	def, err := m.st.GetPool(ctx, ps.def.Name)
	ps.mu.Lock()
	defer m.unlock(ps)
	switch {
	case errors.Is(err, store.ErrNotFound):
		if !ps.deleting {
			m.log.Info("pool deleted: no more blocks of it are claimed", "pool", ps.def.Name)
		}
		ps.deleting = true
		return nil
	case err != nil:
		return err
	}
	if def.UID != ps.def.UID && ps.def.UID != "" && def.UID != "" {
		return m.replace(ctx, ps, def)
	}
	ps.deleting = def.Deleting
	if slices.Equal(def.Subnets, ps.def.Subnets) && slices.Equal(def.Reserved, ps.def.Reserved) && def.BlockSizeBits == ps.def.BlockSizeBits {
		ps.def = def
		return nil
	}
	geo, err := NewGeometry(def.Subnets, def.BlockSizeBits, def.Reserved)
	if err != nil {
		return fmt.Errorf("pool %q changed to something invalid (kept as it was): %w", def.Name, err)
	}
	if !sameBlocks(ps.geo, geo, ps.order) {
		return m.replace(ctx, ps, def)
	}
	ps.def, ps.geo = def, geo
	for _, i := range ps.order {
		ps.blocks[i].applyReserved(geo)
	}
	m.log.Info("pool changed: followed", "pool", def.Name, "subnets", def.Subnets, "reserved", def.Reserved)
	return nil
}

// sameBlocks reports whether every block in order has the same addresses
// in both geometries.
func sameBlocks(a, b *Geometry, order []uint32) bool {
	if a.BlockSize() != b.BlockSize() {
		return false
	}
	for _, i := range order {
		if i >= b.Blocks() {
			return false
		}
		a4, a6 := a.BlockPrefixes(i)
		b4, b6 := b.BlockPrefixes(i)
		if a4 != b4 || a6 != b6 {
			return false
		}
	}
	return true
}

// replace swaps ps for a fresh state of the pool def (re-created under the
// same name, or changed so that blocks moved); the caller holds ps.mu. The
// old state's blocks are not this pool's any more: the new state starts
// from the store's blocks of this node, and the addresses attachments
// still hold under the pool's name stay held wherever they fall in it.
func (m *Manager) replace(ctx context.Context, ps *poolState, def store.Pool) error {
	m.mu.RLock()
	gen := m.gen[def.Name]
	m.mu.RUnlock()
	fresh, err := m.newPoolState(ctx, def)
	if err != nil {
		return err
	}
	atts, err := m.st.ListAttachments(ctx)
	if err != nil {
		return err
	}
	for _, a := range atts {
		if a.Pool != def.Name {
			continue
		}
		for _, addr := range a.Addrs {
			fresh.holdStale(addr.Unmap())
		}
	}
	ps.deleting = true // the old state hands out nothing more
	ps.claimed = true
	m.mu.Lock()
	if m.gen[def.Name] != gen || m.pools[def.Name] != ps {
		// Deleted (or replaced) meanwhile: what was read is stale.
		m.mu.Unlock()
		m.kick(def.Name)
		return nil
	}
	m.pools[def.Name] = fresh
	m.mu.Unlock()
	m.log.Warn("pool re-created or its blocks moved: its old geometry is dropped", "pool", def.Name,
		"subnets", def.Subnets, "stale", len(fresh.stale))
	m.kick(def.Name)
	return nil
}

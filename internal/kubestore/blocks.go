package kubestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// ListBlocks lists the blocks of pool ("" = every pool) of every node,
// from the informer cache: a claim skips the indices listed, and the
// Manager keeps the ones of its node. A block whose owner reference names
// another life of its pool (a pool deleted and re-created under the same
// name while the block was kept) is listed as no node's: its index stays
// taken, but nobody allocates from it.
func (s *Store) ListBlocks(ctx context.Context, pool string) ([]store.Block, error) {
	var opts []client.ListOption
	if pool != "" {
		opts = append(opts, client.MatchingLabels{skeinv1.LabelPool: pool})
	}
	var list skeinv1.AddressBlockList
	if err := s.cache.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("list AddressBlocks: %w", err)
	}
	uids := map[string]types.UID{}
	out := make([]store.Block, 0, len(list.Items))
	for i := range list.Items {
		b := &list.Items[i]
		blk, ok := blockOf(b)
		if !ok {
			continue
		}
		uid, seen := uids[blk.Pool]
		if !seen {
			uid = s.poolUID(ctx, blk.Pool)
			uids[blk.Pool] = uid
		}
		if !ofPool(b, uid) {
			blk.Node = ""
		}
		out = append(out, blk)
	}
	slices.SortFunc(out, func(a, b store.Block) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Index, b.Index))
	})
	return out, nil
}

// BlockTaken reports whether the cache has a block at index of pool, any
// node's, being deleted or not (ipam.BlockTaker): its name "<pool>-<index>"
// is taken, and every block has that name (the admission policy and the
// CRD see to it), so this one lookup answers what ListBlocks would.
func (s *Store) BlockTaken(ctx context.Context, pool string, index uint32) (bool, error) {
	err := s.cache.Get(ctx, client.ObjectKey{Name: skeinv1.BlockName(pool, index)}, &skeinv1.AddressBlock{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("look up block %d of pool %q: %w", index, pool, err)
}

var _ ipam.BlockTaker = (*Store)(nil)

// NodeBlocks lists node's blocks of pool from the informer cache (the
// Manager's view of its own, without copying every node's).
func (s *Store) NodeBlocks(ctx context.Context, pool, node string) ([]store.Block, error) {
	var list skeinv1.AddressBlockList
	if err := s.cache.List(ctx, &list, client.MatchingLabels{skeinv1.LabelPool: pool, skeinv1.LabelNode: node}); err != nil {
		return nil, fmt.Errorf("list AddressBlocks: %w", err)
	}
	uid := s.poolUID(ctx, pool)
	out := make([]store.Block, 0, len(list.Items))
	var errs []error
	for i := range list.Items {
		b := &list.Items[i]
		blk, ok := blockOf(b)
		if !ok || blk.Node != node || !ofPool(b, uid) {
			continue
		}
		if !b.DeletionTimestamp.IsZero() {
			// A release cut short between its two writes (the delete, then
			// the finalizer): finish it, or the index stays taken forever.
			if node == s.node {
				errs = append(errs, s.dropFinalizer(ctx, b.DeepCopy()))
			}
			continue
		}
		out = append(out, blk)
	}
	return out, errors.Join(errs...)
}

// blockOf reads a block: its owner is nodeName, or for a block of the
// retired BlockRequest protocol (no nodeName yet) its node label.
func blockOf(b *skeinv1.AddressBlock) (store.Block, bool) {
	pool, node := b.Labels[skeinv1.LabelPool], ownerOf(b)
	if pool == "" || node == "" || b.Index < 0 || b.Index > int64(^uint32(0)) {
		return store.Block{}, false
	}
	return store.Block{Pool: pool, Index: uint32(b.Index), Node: node}, true
}

// ownerOf is the node a block belongs to; "" when its nodeName and node
// label disagree (nobody's: a label is not proof of ownership).
func ownerOf(b *skeinv1.AddressBlock) string {
	label := b.Labels[skeinv1.LabelNode]
	switch {
	case b.NodeName == "":
		return label
	case label != "" && label != b.NodeName:
		return ""
	}
	return b.NodeName
}

// ofPool reports whether b belongs to the life of its pool with uid (no
// owner reference to an AddressPool, or an unknown uid, counts as yes).
func ofPool(b *skeinv1.AddressBlock, uid types.UID) bool {
	if uid == "" {
		return true
	}
	for _, ref := range b.OwnerReferences {
		if ref.Kind == "AddressPool" && ref.APIVersion == skeinv1.GroupVersion.String() {
			return ref.UID == uid
		}
	}
	return true
}

func (s *Store) poolUID(ctx context.Context, pool string) types.UID {
	p := &skeinv1.AddressPool{}
	if err := s.cache.Get(ctx, client.ObjectKey{Name: pool}, p); err != nil {
		return ""
	}
	return p.UID
}

// ClaimBlock claims block *want of pool for node: one create of the
// AddressBlock "<pool>-<index>". The API server's create-if-absent is the
// lock: created means the node owns the block from now on; an existing
// block is store.ErrConflict (the returned Block names its owner) unless
// it is this node's already and not being deleted (a claim whose answer
// was lost, or Restore on start). The pool is then read past the cache:
// a pool deleted or re-created while the create was in flight gets no
// block (it is deleted again at once). Without want it refuses: the
// Manager chooses indices.
func (s *Store) ClaimBlock(ctx context.Context, pool, node string, _ uint32, want *uint32, _ func(uint32) bool) (_ store.Block, err error) {
	if node != s.node {
		return store.Block{}, fmt.Errorf("claim a block for node %q: this store is node %q's", node, s.node)
	}
	if want == nil {
		return store.Block{}, fmt.Errorf("claim a block of pool %q: a node claims blocks by index: %w", pool, store.ErrConflict)
	}
	start := time.Now()
	defer func() { s.m.observeClaim(pool, time.Since(start), err) }()
	p := &skeinv1.AddressPool{}
	if err := s.cache.Get(ctx, client.ObjectKey{Name: pool}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return store.Block{}, fmt.Errorf("%w: no AddressPool %q", ipam.ErrPoolNotFound, pool)
		}
		return store.Block{}, fmt.Errorf("get AddressPool %q: %w", pool, err)
	}
	if !p.DeletionTimestamp.IsZero() {
		return store.Block{}, fmt.Errorf("%w: AddressPool %q is being deleted", ipam.ErrPoolNotFound, pool)
	}
	b, err := s.blockObject(p, *want)
	if err != nil {
		return store.Block{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err = s.client.Create(cctx, b)
	switch {
	case apierrors.IsAlreadyExists(err):
		s.m.conflicts.Inc()
		return s.existing(ctx, pool, *want)
	case err != nil && cctx.Err() != nil && ctx.Err() == nil:
		// The create may still have happened: the Manager adopts the block
		// when it shows up (its node is this one), so it does not leak.
		return store.Block{}, fmt.Errorf("%w: create AddressBlock %s: no answer within %v: %v", ipam.ErrTryAgain, b.Name, s.timeout, err)
	case err != nil:
		return store.Block{}, fmt.Errorf("create AddressBlock %s: %w", b.Name, err)
	}
	s.own(b.Name, b.UID)
	if err := s.poolStillThere(ctx, p, b.ResourceVersion); err != nil {
		if rerr := s.ReleaseBlock(context.WithoutCancel(ctx), pool, *want, node); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return store.Block{}, err
	}
	return store.Block{Pool: pool, Index: *want, Node: node}, nil
}

// blockObject is the AddressBlock of index in pool p for this node.
func (s *Store) blockObject(p *skeinv1.AddressPool, index uint32) (*skeinv1.AddressBlock, error) {
	def, err := poolOf(p)
	if err != nil {
		return nil, err
	}
	geo, err := ipam.NewGeometry(def.Subnets, def.BlockSizeBits, def.Reserved)
	if err != nil {
		return nil, fmt.Errorf("AddressPool %s: %w", p.Name, err)
	}
	if index >= geo.Blocks() {
		return nil, fmt.Errorf("block %d of pool %q: the pool has %d blocks", index, p.Name, geo.Blocks())
	}
	b := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{
			Name:       skeinv1.BlockName(p.Name, index),
			Labels:     map[string]string{skeinv1.LabelPool: p.Name, skeinv1.LabelNode: s.node},
			Finalizers: []string{skeinv1.FinalizerBlock},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: skeinv1.GroupVersion.String(), Kind: "AddressPool", Name: p.Name, UID: p.UID,
				BlockOwnerDeletion: ptr.To(false), // true would need update on addresspools/finalizers (OwnerReferencesPermissionEnforcement)
			}},
		},
		NodeName: s.node,
		Index:    int64(index),
	}
	v4, v6 := geo.BlockPrefixes(index)
	if v4.IsValid() {
		b.IPv4 = ptr.To(v4.String())
	}
	if v6.IsValid() {
		b.IPv6 = ptr.To(v6.String())
	}
	return b, nil
}

// existing answers a claim refused because block index of pool exists:
// the block when it is this node's and live, ErrConflict otherwise.
func (s *Store) existing(ctx context.Context, pool string, index uint32) (store.Block, error) {
	name := skeinv1.BlockName(pool, index)
	b := &skeinv1.AddressBlock{}
	// The cache usually has not seen the block yet (that is why the node
	// asked for it), but when it has and it is another node's, that is the
	// answer without a read: the cache only moves forward, and a block of
	// this node's made since (a lost answer) is adopted when it shows up.
	if err := s.cache.Get(ctx, client.ObjectKey{Name: name}, b); err == nil {
		if owner := ownerOf(b); owner != "" && owner != s.node {
			return store.Block{Pool: pool, Index: index, Node: owner},
				fmt.Errorf("block %d of pool %q is node %q's: %w", index, pool, owner, store.ErrConflict)
		}
	}
	b = &skeinv1.AddressBlock{}
	if err := s.client.Get(ctx, client.ObjectKey{Name: name}, b); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted since: the index is free again, but this claim lost.
			return store.Block{Pool: pool, Index: index}, fmt.Errorf("block %d of pool %q was taken and freed meanwhile: %w", index, pool, store.ErrConflict)
		}
		return store.Block{}, fmt.Errorf("get AddressBlock %s: %w", name, err)
	}
	owner := ownerOf(b)
	if owner == s.node && b.DeletionTimestamp.IsZero() && ofPool(b, s.poolUID(ctx, pool)) {
		if b.NodeName == "" {
			if err := s.adoptOne(ctx, b); err != nil {
				return store.Block{}, err
			}
		}
		s.own(name, b.UID)
		return store.Block{Pool: pool, Index: index, Node: owner}, nil
	}
	return store.Block{Pool: pool, Index: index, Node: owner},
		fmt.Errorf("block %d of pool %q is node %q's: %w", index, pool, owner, store.ErrConflict)
}

// poolStillThere reads pool p as it was when the block was created (at
// resource version rv or later): an error when it is gone, re-created
// (another UID) or being deleted. Anything done to the pool before the
// block's create is in that read; anything after it the pool's finalizer
// covers (the pool waits for its blocks, and the node gives the block back
// once it sees the deletion). "Not older than rv" is answered from the API
// server's watch cache, without a quorum read from etcd: one per claim was
// a third of a 1,000-node burst's requests. A read the cache cannot answer
// (it did not catch up in time) is made again from etcd.
func (s *Store) poolStillThere(ctx context.Context, p *skeinv1.AddressPool, rv string) error {
	live := &skeinv1.AddressPool{}
	var err error
	if rv != "" {
		err = s.client.Get(ctx, client.ObjectKeyFromObject(p), live, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: rv}})
	}
	if rv == "" || err != nil && !apierrors.IsNotFound(err) {
		live = &skeinv1.AddressPool{}
		err = s.client.Get(ctx, client.ObjectKeyFromObject(p), live)
	}
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: AddressPool %q was deleted while a block of it was claimed", ipam.ErrPoolNotFound, p.Name)
	case err != nil:
		return fmt.Errorf("read AddressPool %q after a claim: %w", p.Name, err)
	case live.UID != p.UID:
		return fmt.Errorf("%w: AddressPool %q was re-created while a block of it was claimed", ipam.ErrTryAgain, p.Name)
	case !live.DeletionTimestamp.IsZero():
		return fmt.Errorf("%w: AddressPool %q is being deleted", ipam.ErrPoolNotFound, p.Name)
	}
	return nil
}

// ReleaseBlock deletes the block (with a UID precondition: a block of
// the same name made since by another node is not touched) and removes
// its finalizer, so it is gone at once. nil when the block is gone
// already; store.ErrConflict when another node owns it.
func (s *Store) ReleaseBlock(ctx context.Context, pool string, index uint32, node string) error {
	name := skeinv1.BlockName(pool, index)
	b := &skeinv1.AddressBlock{}
	if err := s.client.Get(ctx, client.ObjectKey{Name: name}, b); err != nil {
		if apierrors.IsNotFound(err) {
			s.retire(name, "")
			return nil
		}
		return fmt.Errorf("get AddressBlock %s: %w", name, err)
	}
	if owner := ownerOf(b); owner != node {
		s.retire(name, "")
		return fmt.Errorf("AddressBlock %s is node %q's, not %q's: %w", name, owner, node, store.ErrConflict)
	}
	// Delete first: a block with a deletion timestamp is visibly being
	// freed (and owned by nobody); if skeind dies before the finalizer is
	// removed, the next start finds it and comes here again.
	s.disown(name, "")
	uid := b.UID
	err := s.client.Delete(ctx, b, client.Preconditions{UID: &uid})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Deleted, gone, or another block of that name: that life of it
		// is over for this node.
		s.retire(name, uid)
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		// The delete may or may not have happened (its answer lost). If
		// the block is still there, this node's and not being deleted, it
		// is owned again: neither reported lost nor left unused for ever.
		// If it cannot be read, it stays disowned (safe: nothing is handed
		// out from it; at worst a false report).
		cur := &skeinv1.AddressBlock{}
		if gerr := s.client.Get(context.WithoutCancel(ctx), client.ObjectKey{Name: name}, cur); gerr == nil &&
			cur.UID == uid && ownerOf(cur) == node && cur.DeletionTimestamp.IsZero() {
			s.own(name, uid)
		}
		return fmt.Errorf("delete AddressBlock %s: %w", name, err)
	}
	return s.dropFinalizer(ctx, b)
}

// dropFinalizer removes FinalizerBlock from b with a JSON patch that tests
// the entry first: other finalizers are kept even if added meanwhile (the
// delete above changed the resource version, so an optimistic-lock patch
// would always conflict). When the test fails the block is read again
// from the API, once.
func (s *Store) dropFinalizer(ctx context.Context, b *skeinv1.AddressBlock) error {
	for attempt := 0; ; attempt++ {
		i := slices.Index(b.Finalizers, skeinv1.FinalizerBlock)
		if i < 0 {
			return nil
		}
		patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/uid","value":%q},{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`,
			b.UID, i, skeinv1.FinalizerBlock, i)
		err := s.client.Patch(ctx, b.DeepCopy(), client.RawPatch(types.JSONPatchType, []byte(patch)))
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case attempt == 0 && apierrors.IsInvalid(err):
			fresh := &skeinv1.AddressBlock{}
			if gerr := s.client.Get(ctx, client.ObjectKeyFromObject(b), fresh); gerr != nil {
				return client.IgnoreNotFound(gerr)
			}
			if fresh.UID != b.UID {
				return nil // another block of that name
			}
			b = fresh
		default:
			return fmt.Errorf("remove the finalizer of AddressBlock %s: %w", b.Name, err)
		}
	}
}

// adoptOld gives this node's blocks of the retired BlockRequest protocol
// (the node label, no nodeName) their nodeName, so that they are owned
// the way new ones are. It runs once at start.
func (s *Store) adoptOld(ctx context.Context) error {
	var list skeinv1.AddressBlockList
	if err := s.cache.List(ctx, &list, client.MatchingLabels{skeinv1.LabelNode: s.node}); err != nil {
		return fmt.Errorf("list AddressBlocks: %w", err)
	}
	var errs []error
	for i := range list.Items {
		b := &list.Items[i]
		if b.NodeName != "" || !b.DeletionTimestamp.IsZero() {
			continue
		}
		errs = append(errs, s.adoptOne(ctx, b.DeepCopy()))
	}
	return errors.Join(errs...)
}

// adoptOne sets b's nodeName to this node (an update with b's resource
// version: a change meanwhile fails it).
func (s *Store) adoptOne(ctx context.Context, b *skeinv1.AddressBlock) error {
	b.NodeName = s.node
	if err := s.client.Update(ctx, b); err != nil {
		return fmt.Errorf("adopt AddressBlock %s of the BlockRequest protocol: %w", b.Name, err)
	}
	return nil
}

// Owns reports whether block index of pool is node's (this Store's node)
// as far as the Store has seen: created by its claim, or seen in the cache
// with this node as owner, and not deleted or given to another node since.
func (s *Store) Owns(pool string, index uint32, node string) bool {
	if node != s.node {
		return false
	}
	s.ownMu.RLock()
	defer s.ownMu.RUnlock()
	_, ok := s.owned[skeinv1.BlockName(pool, index)]
	return ok
}

// own records that this node owns block name (uid), unless that life of
// the block was dropped already (see Store.dropped).
func (s *Store) own(name string, uid types.UID) {
	s.ownMu.Lock()
	if !s.dropped[uid] {
		s.owned[name] = uid
	}
	s.ownMu.Unlock()
}

// retire forgets block name for good: uid (or the one owned holds, with
// "") is over for this node, as a live read or a delete has shown, and a
// stale copy in the cache must not make it this node's again.
func (s *Store) retire(name string, uid types.UID) {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	cur, ok := s.owned[name]
	if uid == "" {
		uid = cur
	}
	if ok && cur == uid {
		delete(s.owned, name)
	}
	s.retireLocked(uid)
}

// retireLocked marks uid dropped; ownMu is held.
func (s *Store) retireLocked(uid types.UID) {
	if uid == "" {
		return
	}
	if s.dropped == nil {
		s.dropped = map[types.UID]bool{}
	}
	s.dropped[uid] = true
}

// disown forgets block name; with a uid, only that life of it.
func (s *Store) disown(name string, uid types.UID) {
	s.ownMu.Lock()
	if cur, ok := s.owned[name]; ok && (uid == "" || cur == uid) {
		delete(s.owned, name)
	}
	s.ownMu.Unlock()
}

// observeBlock keeps the owned set in step with what the cache sees of a
// block, and tells the Manager about changes of this node's blocks.
func (s *Store) observeBlock(b *skeinv1.AddressBlock, deleted bool) {
	mine := ownerOf(b) == s.node
	switch {
	case deleted:
		s.disown(b.Name, b.UID)
		// The cache holds no copy of it any more, and a UID deleted
		// never comes back: nothing is left to refuse.
		s.ownMu.Lock()
		delete(s.dropped, b.UID)
		s.ownMu.Unlock()
	case mine && b.DeletionTimestamp.IsZero():
		s.own(b.Name, b.UID)
	default:
		s.disown(b.Name, "") // being deleted, or another node's now
	}
	if mine || b.Labels[skeinv1.LabelNode] == s.node {
		s.notify(b.Labels[skeinv1.LabelPool])
	}
}

func (s *Store) notify(pool string) {
	s.watchMu.Lock()
	f := s.changed
	s.watchMu.Unlock()
	if f != nil && pool != "" {
		f(pool)
	}
}

// Watch registers changed: it is called with a pool's name when the pool
// or one of this node's blocks of it changes in the cache.
func (s *Store) Watch(changed func(pool string)) {
	s.watchMu.Lock()
	s.changed = changed
	s.watchMu.Unlock()
}

// BlockLost is the Manager's report of a block of this node's that is not
// its own any more: counted, and told on the node's Node object as a
// Warning event (when there is one).
func (s *Store) BlockLost(pool string, index uint32, held int) {
	s.m.lost.WithLabelValues(pool).Inc()
	s.event("BlockLost", fmt.Sprintf("AddressBlock %s is no longer this node's (deleted or given to another node) while %d of its addresses are in use here: no address is handed out from it again",
		skeinv1.BlockName(pool, index), held))
}

package kubestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// pollEvery is how often GrantBlock looks at the cache for the answer.
// Looking costs no API request.
const pollEvery = 5 * time.Millisecond

// ListBlocks lists this node's blocks of pool ("" = every pool) from the
// informer cache. Other nodes' blocks are not cached (a cluster has
// thousands): in Kubernetes mode the controller, not the node, looks for
// free blocks.
func (s *Store) ListBlocks(ctx context.Context, pool string) ([]store.Block, error) {
	// The node's label is asked for even though the Store's own cache
	// holds only this node's blocks: an injected cache holds every node's.
	match := client.MatchingLabels{skeinv1.LabelNode: s.node}
	if pool != "" {
		match[skeinv1.LabelPool] = pool
	}
	opts := []client.ListOption{match}
	var list skeinv1.AddressBlockList
	if err := s.cache.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("list AddressBlocks: %w", err)
	}
	out := make([]store.Block, 0, len(list.Items))
	for _, b := range list.Items {
		if blk, ok := blockOf(&b); ok {
			out = append(out, blk)
		}
	}
	slices.SortFunc(out, func(a, b store.Block) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Index, b.Index))
	})
	return out, nil
}

func blockOf(b *skeinv1.AddressBlock) (store.Block, bool) {
	pool, node := b.Labels[skeinv1.LabelPool], b.Labels[skeinv1.LabelNode]
	if pool == "" || node == "" || b.Index < 0 || b.Index > int64(^uint32(0)) {
		return store.Block{}, false
	}
	return store.Block{Pool: pool, Index: uint32(b.Index), Node: node}, true
}

// ClaimBlock cannot pick a block in Kubernetes mode (GrantBlock asks the
// controller instead). It answers only for a block this node owns already
// (Restore on start, a static address in a block the node does not hold in
// memory): the block, or store.ErrConflict when it is not this node's.
//
// It reads the API server, not the cache: a block this node has just
// freed may linger in the cache, and taking it again from there would
// hand out addresses of a block the controller may give another node. It
// is rare (once per block on start), so the read costs little.
func (s *Store) ClaimBlock(ctx context.Context, pool, node string, _ uint32, want *uint32, _ func(uint32) bool) (store.Block, error) {
	if want == nil {
		return store.Block{}, fmt.Errorf("claim a block of pool %q: in kubernetes mode skein-controller chooses blocks: %w", pool, store.ErrConflict)
	}
	b := &skeinv1.AddressBlock{}
	err := s.client.Get(ctx, client.ObjectKey{Name: skeinv1.BlockName(pool, *want)}, b)
	if err == nil {
		if blk, ok := blockOf(b); ok && blk.Node == node && blk.Pool == pool && b.DeletionTimestamp.IsZero() {
			return blk, nil
		}
		if owner := b.Labels[skeinv1.LabelNode]; owner != node {
			return store.Block{Pool: pool, Index: *want, Node: owner},
				fmt.Errorf("block %d of pool %q is node %q's: %w", *want, pool, owner, store.ErrConflict)
		}
	} else if !apierrors.IsNotFound(err) {
		return store.Block{}, fmt.Errorf("get AddressBlock %s: %w", skeinv1.BlockName(pool, *want), err)
	}
	return store.Block{Pool: pool, Index: *want},
		fmt.Errorf("block %d of pool %q is not node %q's, and in kubernetes mode skein-controller chooses blocks: %w", *want, pool, node, store.ErrConflict)
}

// ReleaseBlock deletes the block and removes its finalizer, so it is gone
// at once. nil when the block is gone already; store.ErrConflict when
// another node owns it.
func (s *Store) ReleaseBlock(ctx context.Context, pool string, index uint32, node string) error {
	name := skeinv1.BlockName(pool, index)
	b := &skeinv1.AddressBlock{}
	if err := s.cache.Get(ctx, client.ObjectKey{Name: name}, b); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("get AddressBlock %s: %w", name, err)
	}
	if owner := b.Labels[skeinv1.LabelNode]; owner != node {
		return fmt.Errorf("AddressBlock %s is node %q's, not %q's: %w", name, owner, node, store.ErrConflict)
	}
	// Delete first: a block with a deletion timestamp is visibly being
	// freed; if skeind dies before the finalizer is removed, the next
	// start finds the block unused and comes here again.
	uid := b.UID
	err := s.client.Delete(ctx, b, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete AddressBlock %s: %w", name, err)
	}
	if apierrors.IsNotFound(err) {
		return nil
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
		patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`,
			i, skeinv1.FinalizerBlock, i)
		err := s.client.Patch(ctx, b.DeepCopy(), client.RawPatch(types.JSONPatchType, []byte(patch)))
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case attempt == 0 && apierrors.IsInvalid(err):
			fresh := &skeinv1.AddressBlock{}
			if gerr := s.client.Get(ctx, client.ObjectKeyFromObject(b), fresh); gerr != nil {
				return client.IgnoreNotFound(gerr)
			}
			b = fresh
		default:
			return fmt.Errorf("remove the finalizer of AddressBlock %s: %w", b.Name, err)
		}
	}
}

// GrantBlock asks skein-controller for a block of pool: it creates a
// BlockRequest, waits for it to be answered (at most the grant timeout),
// waits for the AddressBlock to reach the cache, and deletes the request
// whatever the outcome.
func (s *Store) GrantBlock(ctx context.Context, pool, node string) (_ store.Block, err error) {
	if node != s.node {
		return store.Block{}, fmt.Errorf("grant a block to node %q: this store is node %q's", node, s.node)
	}
	if _, err := s.GetPool(ctx, pool); errors.Is(err, store.ErrNotFound) {
		return store.Block{}, fmt.Errorf("%w: no AddressPool %q", ipam.ErrPoolNotFound, pool)
	}
	start := time.Now()
	defer func() { s.m.observeGrant(pool, time.Since(start), err) }()
	br := &skeinv1.BlockRequest{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: node + "-",
			Labels:       map[string]string{skeinv1.LabelNode: node, skeinv1.LabelPool: pool},
		},
		Spec: skeinv1.BlockRequestSpec{NodeName: node, PoolName: pool},
	}
	if ref := s.nodeOwner(ctx); ref != nil {
		br.OwnerReferences = []metav1.OwnerReference{*ref}
	}
	if err := s.client.Create(ctx, br); err != nil {
		return store.Block{}, fmt.Errorf("create BlockRequest for pool %q: %w", pool, err)
	}
	defer func() {
		// The request has done its work, or failed: it goes either way, so
		// nothing is left behind.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if derr := s.client.Delete(dctx, br); derr != nil && !apierrors.IsNotFound(derr) && err == nil {
			err = fmt.Errorf("delete BlockRequest %s: %w", br.Name, derr)
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	blk, err := s.await(wctx, br.Name, pool)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		return store.Block{}, fmt.Errorf("%w: BlockRequest %s for pool %q not answered within %v (is skein-controller running?)",
			ipam.ErrTryAgain, br.Name, pool, s.timeout)
	}
	return blk, err
}

// await polls the cache until request name is answered and, when it is
// Complete, its block is in the cache.
func (s *Store) await(ctx context.Context, name, pool string) (store.Block, error) {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		br := &skeinv1.BlockRequest{}
		if err := s.cache.Get(ctx, client.ObjectKey{Name: name}, br); err == nil {
			if c := meta.FindStatusCondition(br.Status.Conditions, skeinv1.ConditionFailed); c != nil && c.Status == metav1.ConditionTrue {
				return store.Block{}, failure(name, pool, c)
			}
			if meta.IsStatusConditionTrue(br.Status.Conditions, skeinv1.ConditionComplete) {
				b := &skeinv1.AddressBlock{}
				if err := s.cache.Get(ctx, client.ObjectKey{Name: br.Status.AddressBlockName}, b); err == nil {
					blk, ok := blockOf(b)
					if !ok || blk.Node != s.node || blk.Pool != pool {
						return store.Block{}, fmt.Errorf("BlockRequest %s was answered with AddressBlock %s, which is not node %q's block of pool %q",
							name, b.Name, s.node, pool)
					}
					return blk, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return store.Block{}, ctx.Err()
		case <-t.C:
		}
	}
}

// failure maps a Failed condition onto ipam's errors.
func failure(name, pool string, c *metav1.Condition) error {
	var kind error
	switch c.Reason {
	case skeinv1.ReasonPoolExhausted:
		kind = ipam.ErrExhausted
	case skeinv1.ReasonPoolNotFound:
		kind = ipam.ErrPoolNotFound
	default:
		kind = ipam.ErrInvalidPool
	}
	return fmt.Errorf("%w: BlockRequest %s for pool %q failed: %s: %s", kind, name, pool, c.Reason, c.Message)
}

// nodeOwner returns an owner reference to this node's Node object, looked
// up once it exists (a read; the request is not refused without one, so
// skeind also runs where nodes are not Node objects, as in tests).
func (s *Store) nodeOwner(ctx context.Context) *metav1.OwnerReference {
	s.ownerMu.Lock()
	defer s.ownerMu.Unlock()
	if s.owner != nil {
		return s.owner
	}
	n := &corev1.Node{}
	if err := s.client.Get(ctx, client.ObjectKey{Name: s.node}, n); err != nil {
		return nil
	}
	s.owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID, BlockOwnerDeletion: ptr.To(false)}
	return s.owner
}

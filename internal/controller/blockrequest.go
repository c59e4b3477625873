package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
)

// BlockRequestReconciler carves a block of a pool for each BlockRequest.
//
// No index is ever carved twice, however many controllers run: a block's
// name is "<pool>-<index>" and the API server refuses a second object of
// one name. No request gets two blocks either, even across a crash or a
// second controller working on it: the controller first writes the name it
// chose into the request's status (a write that fails with a conflict when
// anyone else changed the request since it was read), then makes the block
// labelled with the request's UID, then sets Complete. A retry finds the
// name in the status and the block carrying its UID, and only finishes.
//
// Several workers serve requests at once. Each finds the lowest free index
// from the cache's blocks (read in place, not copied) and reserves it in
// memory until the cache shows its block, so that the workers of one
// process do not race each other for an index; across processes the
// block's name still decides.
type BlockRequestReconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// Reader reads what the cache may not have seen yet (a block another
	// controller made a moment ago); nil means Client.
	Reader client.Reader
	// Workers is how many requests are served at once; below 1 means 1.
	Workers int

	// res keeps this process's workers from choosing one index at once.
	res reservations
}

// maxTries bounds the indices one reconcile tries when the cache is behind
// and its first choices turn out to be taken.
const maxTries = 16

// conflictRetry is when a request is looked at again after a write lost a
// race (the watch usually brings it back sooner).
const conflictRetry = 100 * time.Millisecond

// SetupWithManager registers the reconciler with mgr.
func (r *BlockRequestReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&skeinv1.BlockRequest{}).
		Named("blockrequest").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Workers, 1)}).
		Complete(countErrors("blockrequest", r))
}

// Reconcile serves one BlockRequest.
func (r *BlockRequestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	br := &skeinv1.BlockRequest{}
	if err := r.Client.Get(ctx, req.NamespacedName, br); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if finished(br) || !br.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	// Work on a copy: what Get returned may be the cache's own object.
	br = br.DeepCopy()

	pool := &skeinv1.AddressPool{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: br.Spec.PoolName}, pool); apierrors.IsNotFound(err) {
		return r.fail(ctx, br, skeinv1.ReasonPoolNotFound, fmt.Sprintf("there is no AddressPool %q", br.Spec.PoolName))
	} else if err != nil {
		return ctrl.Result{}, fmt.Errorf("get pool %s: %w", br.Spec.PoolName, err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return r.fail(ctx, br, skeinv1.ReasonPoolNotFound, fmt.Sprintf("AddressPool %q is being deleted", pool.Name))
	}
	geo, err := PoolGeometry(pool)
	if err != nil {
		return r.fail(ctx, br, skeinv1.ReasonPoolInvalid, err.Error())
	}

	// The index this reconcile reserved and has not yet settled or
	// released; whatever way the reconcile ends, it is given back.
	var holding *uint32
	defer func() {
		if holding != nil {
			r.res.release(pool.Name, *holding, time.Now())
		}
	}()
	var taken []uint32 // indices found taken during this reconcile
	for range maxTries {
		// Step 1: choose an index and record it in the request.
		idx, ok := parseBlockName(br.Status.AddressBlockName, pool.Name, geo)
		if ok {
			r.res.hold(pool.Name, idx)
			holding = &idx
		} else {
			idx, ok, err = r.nextFree(ctx, pool.Name, geo, taken)
			if err != nil {
				return ctrl.Result{}, err
			}
			if !ok {
				return r.fail(ctx, br, skeinv1.ReasonPoolExhausted,
					fmt.Sprintf("all %d blocks of AddressPool %q are taken", geo.Blocks(), pool.Name))
			}
			holding = &idx
			br.Status.AddressBlockName = skeinv1.BlockName(pool.Name, idx)
			if err := r.Client.Status().Update(ctx, br); err != nil {
				return requeueOnConflict(err, "record block name in request %s", br.Name)
			}
		}
		// Step 2: make the block; its name makes the index ours or not.
		blk, err := r.newBlock(pool, geo, idx, br)
		if err != nil {
			return ctrl.Result{}, err
		}
		err = r.Client.Create(ctx, blk)
		if apierrors.IsAlreadyExists(err) {
			mine, err := r.carvedFor(ctx, blk.Name, br)
			if err != nil {
				return ctrl.Result{}, err
			}
			if !mine {
				// Another request has it: the cache was behind.
				r.res.settle(pool.Name, idx, time.Now())
				holding = nil
				collisions.Inc()
				taken = append(taken, idx)
				br.Status.AddressBlockName = ""
				continue
			}
		} else if err != nil {
			return ctrl.Result{}, fmt.Errorf("create AddressBlock %s: %w", blk.Name, err)
		}
		r.res.settle(pool.Name, idx, time.Now())
		holding = nil
		// Step 3: done.
		return r.complete(ctx, br, blk)
	}
	return ctrl.Result{RequeueAfter: conflictRetry}, nil
}

// finished reports whether the request has its answer.
func finished(br *skeinv1.BlockRequest) bool {
	return meta.IsStatusConditionTrue(br.Status.Conditions, skeinv1.ConditionComplete) ||
		meta.IsStatusConditionTrue(br.Status.Conditions, skeinv1.ConditionFailed)
}

// parseBlockName returns the index of block name of pool, if it is one of
// the pool's blocks.
func parseBlockName(name, pool string, geo *ipam.Geometry) (uint32, bool) {
	s, ok := strings.CutPrefix(name, pool+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseUint(s, 10, 32)
	if err != nil || uint32(i) >= geo.Blocks() || strconv.FormatUint(i, 10) != s {
		return 0, false
	}
	return uint32(i), true
}

// nextFree reserves and returns the lowest index of the pool that no
// block holds (as far as the cache knows), that is not in taken and that
// no other worker of this process has reserved.
func (r *BlockRequestReconciler) nextFree(ctx context.Context, pool string, geo *ipam.Geometry, taken []uint32) (uint32, bool, error) {
	// The cache's own objects, not copies: a pool may have thousands of
	// blocks, and only their indices are read here.
	var blocks skeinv1.AddressBlockList
	if err := r.Client.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelPool: pool}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, false, fmt.Errorf("list blocks of pool %s: %w", pool, err)
	}
	cached := make([]uint32, 0, len(blocks.Items))
	for i := range blocks.Items {
		if b := blocks.Items[i].Index; b >= 0 && b < int64(geo.Blocks()) {
			cached = append(cached, uint32(b))
		}
	}
	idx, ok := r.res.pick(pool, geo.Blocks(), cached, taken, time.Now())
	return idx, ok, nil
}

// newBlock is block idx of pool for br's node: labelled with the pool,
// the node and the request, owned by the pool, held by FinalizerBlock.
func (r *BlockRequestReconciler) newBlock(pool *skeinv1.AddressPool, geo *ipam.Geometry, idx uint32, br *skeinv1.BlockRequest) (*skeinv1.AddressBlock, error) {
	blk := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{
			Name: skeinv1.BlockName(pool.Name, idx),
			Labels: map[string]string{
				skeinv1.LabelPool:    pool.Name,
				skeinv1.LabelNode:    br.Spec.NodeName,
				skeinv1.LabelRequest: string(br.UID),
			},
			Finalizers: []string{skeinv1.FinalizerBlock},
		},
		Index: int64(idx),
	}
	v4, v6 := geo.BlockPrefixes(idx)
	if v4.IsValid() {
		blk.IPv4 = ptr.To(v4.String())
	}
	if v6.IsValid() {
		blk.IPv6 = ptr.To(v6.String())
	}
	if err := controllerutil.SetControllerReference(pool, blk, r.Client.Scheme()); err != nil {
		return nil, fmt.Errorf("own block %s by pool %s: %w", blk.Name, pool.Name, err)
	}
	return blk, nil
}

// carvedFor reports whether the existing block name was made for br. It
// reads past the cache: the block may be seconds old.
func (r *BlockRequestReconciler) carvedFor(ctx context.Context, name string, br *skeinv1.BlockRequest) (bool, error) {
	rd := r.Reader
	if rd == nil {
		rd = r.Client
	}
	blk := &skeinv1.AddressBlock{}
	if err := rd.Get(ctx, client.ObjectKey{Name: name}, blk); err != nil {
		// Gone again since Create said it exists: try the name again.
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("AddressBlock %s vanished while carving it; retrying", name)
		}
		return false, fmt.Errorf("get AddressBlock %s: %w", name, err)
	}
	return blk.Labels[skeinv1.LabelRequest] == string(br.UID), nil
}

func (r *BlockRequestReconciler) complete(ctx context.Context, br *skeinv1.BlockRequest, blk *skeinv1.AddressBlock) (ctrl.Result, error) {
	var prefixes []string
	for _, p := range []*string{blk.IPv4, blk.IPv6} {
		if p != nil {
			prefixes = append(prefixes, *p)
		}
	}
	meta.SetStatusCondition(&br.Status.Conditions, metav1.Condition{
		Type:               skeinv1.ConditionComplete,
		Status:             metav1.ConditionTrue,
		Reason:             skeinv1.ReasonBlockCarved,
		Message:            fmt.Sprintf("AddressBlock %s (%s) is node %s's", blk.Name, strings.Join(prefixes, ", "), br.Spec.NodeName),
		ObservedGeneration: br.Generation,
	})
	if err := r.Client.Status().Update(ctx, br); err != nil {
		return requeueOnConflict(err, "complete request %s", br.Name)
	}
	observeAnswer(resultComplete, br.CreationTimestamp.Time)
	log.FromContext(ctx).V(1).Info("carved block", "block", blk.Name, "node", br.Spec.NodeName)
	return ctrl.Result{}, nil
}

// fail sets the condition Failed: the request cannot be served as it is.
func (r *BlockRequestReconciler) fail(ctx context.Context, br *skeinv1.BlockRequest, reason, msg string) (ctrl.Result, error) {
	meta.SetStatusCondition(&br.Status.Conditions, metav1.Condition{
		Type:               skeinv1.ConditionFailed,
		Status:             metav1.ConditionTrue,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: br.Generation,
	})
	if err := r.Client.Status().Update(ctx, br); err != nil {
		return requeueOnConflict(err, "fail request %s", br.Name)
	}
	observeAnswer(reason, br.CreationTimestamp.Time)
	log.FromContext(ctx).Info("block request failed", "reason", reason, "message", msg)
	return ctrl.Result{}, nil
}

// requeueOnConflict turns a lost optimistic-concurrency race into a quiet
// retry and anything else into an error.
func requeueOnConflict(err error, format string, args ...any) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	return ctrl.Result{}, fmt.Errorf(format+": %w", append(args, err)...)
}

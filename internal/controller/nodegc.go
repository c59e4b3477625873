package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ctrlutil"
)

// Defaults of NodeGCReconciler's settings.
const (
	// DefaultNodeGCGrace is how long past the end of a node's Lease its
	// blocks are kept once its Node is gone: room for clock skew between
	// the node and the controller and for a skeind restarting slowly.
	DefaultNodeGCGrace = 60 * time.Second
	// DefaultGCInterval is the time between sweeps.
	DefaultGCInterval = 10 * time.Minute
	// DefaultRequestMaxAge is how old a BlockRequest gets before it is
	// deleted whatever its node: nothing answers them any more.
	DefaultRequestMaxAge = 10 * time.Minute
	// DefaultLeaseNamespace holds the nodes' liveness Leases (skeind's
	// --lease-namespace).
	DefaultLeaseNamespace = "skein-system"
)

// NodeGCReconciler takes back what nodes that are gone for good leave
// behind: their AddressBlocks (deleted, and the block finalizer taken
// off, which only the node's skeind would otherwise remove), their
// liveness Lease, and BlockRequests of the retired grant protocol.
//
// A node is gone for good only when both its Node object is gone and its
// skeind has stopped renewing the Lease skeinv1.NodeLeaseName(node) for
// longer than Grace. The Node alone proves nothing: `kubectl delete node`
// of a running node, or a cloud controller deleting a NotReady node that
// comes back, leaves a skeind that still hands out addresses from its
// blocks; taking them would give those addresses to a second node. A node
// whose Lease is still fresh is looked at again when it would expire. A
// node that never had a Lease (it crashed before its first renewal) is
// judged by its newest block instead: gone once that is older than Grace.
//
// A block's owner is its nodeName, or for blocks of the old protocol its
// skein.dev/node label. Kubernetes' garbage collector would not remove the
// blocks (their owner reference is to the pool), and none may run at all.
//
// BlockRequests are no longer answered: those of a deleted Node, and any
// older than RequestMaxAge, are deleted (clusters moving over from the
// old protocol).
//
// The reconciler is keyed by node name: it runs when a Node goes, when a
// block or request of a node appears or changes, and for every node that
// a block, a request or a node Lease names each Interval (objects left
// from a time no controller was watching, Leases of nodes without
// blocks).
type NodeGCReconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// Reader reads past the cache: it confirms that a Node is gone and
	// reads the nodes' Leases (never cached: a thousand nodes renew them
	// every ten seconds, and only those of deleted Nodes matter); nil
	// means Client.
	Reader client.Reader
	// Interval between sweeps; zero means DefaultGCInterval.
	Interval time.Duration
	// LeaseNamespace holds the nodes' Leases; "" means
	// DefaultLeaseNamespace.
	LeaseNamespace string
	// Grace is how long past its Lease's end (or its newest block's
	// creation, without a Lease) a node whose Node is gone keeps its
	// blocks; zero means DefaultNodeGCGrace.
	Grace time.Duration
	// RequestMaxAge: BlockRequests older than this are deleted; zero
	// means DefaultRequestMaxAge.
	RequestMaxAge time.Duration

	// sweeps carries the nodes each sweep finds into the controller's
	// queue, so that their requeues and the queue's one-reconcile-per-key
	// rule apply to them as to any other event.
	sweeps chan event.GenericEvent
	// indexed: the manager's cache indexes blocks by ownerIndex.
	indexed bool

	mu sync.Mutex
	// waiting are the nodes found alive after their Node went: logged
	// once at Info, then at V(1) until they are collected or back.
	waiting map[string]bool
}

// ownerIndex indexes blocks by blockOwner in the manager's cache.
const ownerIndex = "skein.owner"

// requeueSlack is added to a requeue at a deadline, so that the
// reconcile after it finds the deadline passed.
const requeueSlack = 100 * time.Millisecond

// SetupWithManager registers the reconciler and its periodic sweep
// (which, like the reconcilers, runs only on the leader).
func (r *NodeGCReconciler) SetupWithManager(mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &skeinv1.AddressBlock{}, ownerIndex, func(o client.Object) []string {
		return []string{blockOwner(o.(*skeinv1.AddressBlock))}
	})
	if err != nil {
		return fmt.Errorf("index blocks by owner: %w", err)
	}
	r.indexed = true
	r.sweeps = make(chan event.GenericEvent)
	byName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return nodeRequest(o.GetName())
	})
	err = ctrl.NewControllerManagedBy(mgr).
		// Nothing in a Node's update matters: only that it exists.
		For(&corev1.Node{}, builder.OnlyMetadata, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		Watches(&skeinv1.AddressBlock{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return nodeRequest(blockOwner(o.(*skeinv1.AddressBlock)))
		})).
		Watches(&skeinv1.BlockRequest{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return nodeRequest(o.(*skeinv1.BlockRequest).Spec.NodeName)
		})).
		WatchesRawSource(source.Channel(r.sweeps, byName)).
		Named("nodegc").
		WithOptions(ctrlutil.QueueOptions()).
		Complete(ctrlutil.CountErrors("nodegc", r))
	if err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(r.sweepEvery))
}

func nodeRequest(node string) []reconcile.Request {
	if node == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: node}}}
}

// blockOwner is the node that owns blk: its nodeName, or the label of a
// block of the old protocol that its node has not adopted yet.
func blockOwner(blk *skeinv1.AddressBlock) string {
	if blk.NodeName != "" {
		return blk.NodeName
	}
	return blk.Labels[skeinv1.LabelNode]
}

func (r *NodeGCReconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (r *NodeGCReconciler) leaseNamespace() string {
	if r.LeaseNamespace != "" {
		return r.LeaseNamespace
	}
	return DefaultLeaseNamespace
}

// Reconcile takes back the blocks and Lease of node req.Name if it is
// gone for good, and deletes its BlockRequests if its Node is gone or
// they are too old. It asks to be run again when a Lease or a request
// would next pass its deadline.
func (r *NodeGCReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := req.Name
	gone, err := r.nodeGone(ctx, node)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := time.Now()
	var errs []error
	next, err := r.collectRequests(ctx, node, gone, now)
	errs = append(errs, err)
	if !gone {
		r.alive(node, false)
	} else {
		wait, err := r.collectNode(ctx, node, now)
		errs = append(errs, err)
		if wait > 0 && (next == 0 || wait < next) {
			next = wait
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// nodeGone reports whether Node name does not exist, asking the API
// server when the cache does not have it.
func (r *NodeGCReconciler) nodeGone(ctx context.Context, name string) (bool, error) {
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, node)
	if err == nil {
		return false, nil
	}
	if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	err = r.reader().Get(ctx, client.ObjectKey{Name: name}, node)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	return false, nil
}

// collectRequests deletes node's BlockRequests if its Node is gone, or
// those older than RequestMaxAge, and returns when the next of the others
// comes of age (zero: none left).
func (r *NodeGCReconciler) collectRequests(ctx context.Context, node string, gone bool, now time.Time) (time.Duration, error) {
	maxAge := orDefault(r.RequestMaxAge, DefaultRequestMaxAge)
	// Requests are few (none once a cluster has moved over): filtered
	// here rather than indexed.
	var reqs skeinv1.BlockRequestList
	if err := r.Client.List(ctx, &reqs, client.UnsafeDisableDeepCopy); err != nil {
		return 0, fmt.Errorf("list requests: %w", err)
	}
	var next time.Duration
	var errs []error
	for i := range reqs.Items {
		br := &reqs.Items[i]
		if br.Spec.NodeName != node || !br.DeletionTimestamp.IsZero() {
			continue
		}
		age := now.Sub(br.CreationTimestamp.Time)
		if !gone && age < maxAge {
			if wait := maxAge - age + requeueSlack; next == 0 || wait < next {
				next = wait
			}
			continue
		}
		err := r.Client.Delete(ctx, br, client.Preconditions{UID: &br.UID})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			continue // gone already, or another request of that name
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("delete request %s of node %s: %w", br.Name, node, err))
			continue
		}
		gcDeleted.WithLabelValues("BlockRequest").Inc()
		why := "its Node is gone"
		if !gone {
			why = "older than " + maxAge.String()
		}
		log.FromContext(ctx).Info("deleted a BlockRequest (retired: nothing answers them)", "request", br.Name, "node", node, "because", why)
	}
	return next, errors.Join(errs...)
}

// collectNode takes back the blocks and the Lease of node, whose Node is
// gone, if its skeind has stopped too; else it returns how long until
// it may be taken back.
func (r *NodeGCReconciler) collectNode(ctx context.Context, node string, now time.Time) (time.Duration, error) {
	blocks, err := r.blocksOf(ctx, node)
	if err != nil {
		return 0, err
	}
	lease, err := r.lease(ctx, node)
	if err != nil {
		return 0, err
	}
	if len(blocks) == 0 && lease == nil {
		r.alive(node, false)
		return 0, nil
	}
	until, why := r.aliveUntil(lease, blocks)
	if now.Before(until) {
		gcDeferred.Inc()
		lg := log.FromContext(ctx)
		if !r.alive(node, true) {
			lg = lg.V(1)
		}
		lg.Info("the Node is gone but its node is alive: keeping its blocks",
			"node", node, "blocks", len(blocks), "evidence", why, "until", until.UTC().Format(time.RFC3339))
		return until.Sub(now) + requeueSlack, nil
	}
	r.alive(node, false)
	var errs []error
	for i := range blocks {
		errs = append(errs, r.removeBlock(ctx, &blocks[i], node))
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if lease != nil {
		// Only the Lease read: a skeind back meanwhile has renewed it.
		err := r.Client.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion})
		switch {
		case apierrors.IsConflict(err):
			log.FromContext(ctx).Info("the Lease of a deleted node was renewed while collecting it: kept", "node", node)
		case err != nil && !apierrors.IsNotFound(err):
			return 0, fmt.Errorf("delete Lease %s/%s of deleted node %s: %w", lease.Namespace, lease.Name, node, err)
		case err == nil:
			gcDeleted.WithLabelValues("Lease").Inc()
		}
	}
	log.FromContext(ctx).Info("took back what a node gone for good left", "node", node, "blocks", len(blocks),
		"lease", lease != nil, "evidence", why)
	return 0, nil
}

// blocksOf returns copies of the blocks node owns.
func (r *NodeGCReconciler) blocksOf(ctx context.Context, node string) ([]skeinv1.AddressBlock, error) {
	var l skeinv1.AddressBlockList
	if r.indexed {
		if err := r.Client.List(ctx, &l, client.MatchingFields{ownerIndex: node}); err != nil {
			return nil, fmt.Errorf("list blocks of node %s: %w", node, err)
		}
		return l.Items, nil
	}
	// Without the cache's index (a client of the API server): every
	// block, filtered here. The owner is a field, not (only) a label.
	if err := r.Client.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list blocks: %w", err)
	}
	mine := l.Items[:0]
	for _, b := range l.Items {
		if blockOwner(&b) == node {
			mine = append(mine, b)
		}
	}
	return mine, nil
}

// alive notes whether node, whose Node is gone, was found alive, and
// reports whether that is news (worth a log line at Info).
func (r *NodeGCReconciler) alive(node string, alive bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !alive {
		delete(r.waiting, node)
		return false
	}
	if r.waiting[node] {
		return false
	}
	if r.waiting == nil {
		r.waiting = map[string]bool{}
	}
	r.waiting[node] = true
	return true
}

// removeBlock deletes blk, a block of node gone for good, and takes its
// finalizer off: no skeind is left to do it. Both writes are for this
// very block (its UID): a block of the same name claimed since by
// another node is not touched.
func (r *NodeGCReconciler) removeBlock(ctx context.Context, blk *skeinv1.AddressBlock, node string) error {
	if blk.DeletionTimestamp.IsZero() {
		err := r.Client.Delete(ctx, blk, client.Preconditions{UID: &blk.UID})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone, or the name is another block's now
		}
		if err != nil {
			return fmt.Errorf("delete block %s of node %s: %w", blk.Name, node, err)
		}
	}
	if i := slices.Index(blk.Finalizers, skeinv1.FinalizerBlock); i >= 0 {
		patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/uid","value":%q},`+
			`{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`,
			blk.UID, i, skeinv1.FinalizerBlock, i)
		err := r.Client.Patch(ctx, blk, client.RawPatch(types.JSONPatchType, []byte(patch)))
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove finalizer of block %s of node %s: %w", blk.Name, node, err)
		}
	}
	gcDeleted.WithLabelValues("AddressBlock").Inc()
	log.FromContext(ctx).Info("deleted a block of a node gone for good", "block", blk.Name, "node", node)
	return nil
}

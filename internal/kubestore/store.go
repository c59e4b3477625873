package kubestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// DefaultGrantTimeout bounds one block claim (a create) and so an ADD that
// needs one.
const DefaultGrantTimeout = 10 * time.Second

// DefaultLeaseNamespace is where nodes' liveness Leases live (skein's
// namespace in deploy/kubernetes).
const DefaultLeaseNamespace = "skein-system"

// DefaultLeaseDuration is a node Lease's leaseDurationSeconds; the Store
// renews it every quarter of that.
const DefaultLeaseDuration = 40 * time.Second

// ErrReadOnly: skeind does not create or delete pools in Kubernetes mode.
var ErrReadOnly = errors.New("pools are AddressPool objects in kubernetes mode; manage them with kubectl")

// Options configures New. Config, Node and Local are required.
type Options struct {
	// Config reaches the API server.
	Config *rest.Config
	// Node is this node's name (the Node object's, when there is one).
	Node string
	// Local keeps attachments and front doors' records; the Store closes
	// it. A Bolt store must be opened with AttachmentsOnly (its file has no
	// pools in this mode).
	Local store.Store
	// GrantTimeout bounds one claim (the create of a block); 0 =
	// DefaultGrantTimeout.
	GrantTimeout time.Duration
	// LeaseNamespace holds the node's liveness Lease; "" =
	// DefaultLeaseNamespace. LeaseDuration is its duration; 0 =
	// DefaultLeaseDuration, negative = no Lease (tools, benchmarks).
	LeaseNamespace string
	LeaseDuration  time.Duration
	// SyncTimeout bounds the wait for the informer caches in New; 0 = 1 minute.
	SyncTimeout time.Duration
	// Cache, if set, is read instead of informers of the Store's own:
	// skeind shares one cache among its parts, and many Stores in one
	// process (the scale benchmark's simulated nodes) can share one. It
	// must hold AddressPools, Namespaces and every AddressBlock; the
	// caller starts it, waits for it to sync, and stops it after closing
	// the Stores. Nil: New starts informers of its own.
	Cache cache.Cache
}

// Store is a store.Store whose pools and blocks are in the API server. It
// also implements ipam.BlockGranter; Collectors are its metrics.
type Store struct {
	store.Store // the local store: attachments and meta

	node    string
	host    string
	timeout time.Duration
	cache   cache.Cache
	client  client.Client
	stop    context.CancelFunc
	m       *storeMetrics

	ownerMu sync.Mutex
	owner   *metav1.OwnerReference // this node's Node object, once found

	// owned are this node's blocks (name → UID) as far as the Store can
	// prove: its own creates, and what the cache shows since.
	ownMu sync.RWMutex
	owned map[string]types.UID
	// dropped are the UIDs of blocks a live read or this node's own
	// delete found were no longer this node's (verifyOwned, ReleaseBlock:
	// retire): a stale copy of one in the cache (a resync before the
	// cache caught up) must not make it this node's again. A block's
	// owner never changes, so a UID once dropped is never this node's
	// again (a block whose node label someone edited stays dropped until
	// skeind restarts). Pruned when the cache sees the block deleted.
	dropped map[types.UID]bool

	watchMu sync.Mutex
	changed func(pool string)

	lease *leaseKeeper
	done  chan struct{} // closed by Close: ends the Store's goroutines
}

var (
	_ store.Store       = (*Store)(nil)
	_ ipam.ClusterStore = (*Store)(nil)
)

// Scheme knows the kinds the Store reads and writes.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(skeinv1.AddToScheme(Scheme))
}

// New starts the informers (pools, namespaces, and this node's blocks and
// requests) and waits until they have synced; with Options.Cache it reads
// that cache instead.
func New(ctx context.Context, o Options) (_ *Store, err error) {
	if o.Config == nil || o.Node == "" || o.Local == nil {
		return nil, errors.New("kubestore: Config, Node and Local are required")
	}
	if o.GrantTimeout == 0 {
		o.GrantTimeout = DefaultGrantTimeout
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = time.Minute
	}
	m := newStoreMetrics()
	cfg := rest.CopyConfig(o.Config)
	cfg.Wrap(m.countRequests)
	cl, err := client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	c, stop := o.Cache, context.CancelFunc(func() {})
	if c == nil {
		if c, stop, err = startCache(ctx, cfg, o); err != nil {
			return nil, err
		}
	}
	s := &Store{Store: o.Local, node: o.Node, host: cfg.Host, timeout: o.GrantTimeout, cache: c, client: cl, stop: stop, m: m,
		owned: map[string]types.UID{}, done: make(chan struct{})}
	defer func() {
		if err != nil {
			close(s.done)
			stop()
		}
	}()
	if err := s.watch(ctx); err != nil {
		return nil, err
	}
	if err := s.adoptOld(ctx); err != nil {
		return nil, err
	}
	s.nodeOwner(ctx)
	if o.LeaseDuration >= 0 {
		s.lease = newLeaseKeeper(s, o.LeaseNamespace, o.LeaseDuration)
		s.lease.renew(ctx) // first one now: the node is live before it serves
		go s.lease.run(s.done)
	}
	return s, nil
}

// watch follows pools and blocks in the cache: the owned set, and the
// Manager's Watch callback. The handlers' initial adds fill the owned set
// before New returns.
func (s *Store) watch(ctx context.Context) error {
	blocks, err := s.cache.GetInformer(ctx, &skeinv1.AddressBlock{})
	if err != nil {
		return fmt.Errorf("informer for AddressBlocks: %w", err)
	}
	reg, err := blocks.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.onBlock(o, false) },
		UpdateFunc: func(_, o any) { s.onBlock(o, false) },
		DeleteFunc: func(o any) { s.onBlock(o, true) },
	})
	if err != nil {
		return fmt.Errorf("watch AddressBlocks: %w", err)
	}
	pools, err := s.cache.GetInformer(ctx, &skeinv1.AddressPool{})
	if err != nil {
		return fmt.Errorf("informer for AddressPools: %w", err)
	}
	preg, err := pools.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { s.onPool(o) },
		UpdateFunc: func(old, o any) {
			// Status updates (the controller's counts) change nothing a
			// node follows: only the spec (generation), the deletion
			// timestamp and a new life (UID) do.
			a, okA := old.(*skeinv1.AddressPool)
			b, okB := o.(*skeinv1.AddressPool)
			if okA && okB && a.Generation == b.Generation && a.UID == b.UID &&
				a.DeletionTimestamp.IsZero() == b.DeletionTimestamp.IsZero() {
				return
			}
			s.onPool(o)
		},
		DeleteFunc: func(o any) { s.onPool(o) },
	})
	if err != nil {
		return fmt.Errorf("watch AddressPools: %w", err)
	}
	go func() {
		<-s.done
		_ = blocks.RemoveEventHandler(reg)
		_ = pools.RemoveEventHandler(preg)
	}()
	for !reg.HasSynced() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func (s *Store) onBlock(o any, deleted bool) {
	if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	if b, ok := o.(*skeinv1.AddressBlock); ok {
		s.observeBlock(b, deleted)
	}
}

func (s *Store) onPool(o any) {
	if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	if p, ok := o.(*skeinv1.AddressPool); ok {
		s.notify(p.Name)
	}
}

// startCache starts informers for pools, namespaces, and node o.Node's
// blocks and requests, and waits until they have synced; stop ends them.
func startCache(ctx context.Context, cfg *rest.Config, o Options) (_ cache.Cache, stop context.CancelFunc, err error) {
	c, err := cache.New(cfg, cache.Options{Scheme: Scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes cache: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			stop()
		}
	}()
	for _, obj := range []client.Object{&skeinv1.AddressPool{}, &skeinv1.AddressBlock{}, &corev1.Namespace{}} {
		if _, err := c.GetInformer(runCtx, obj); err != nil {
			return nil, nil, fmt.Errorf("informer for %T: %w", obj, err)
		}
	}
	go c.Start(runCtx) //nolint:errcheck // ends with runCtx
	syncCtx, cancel := context.WithTimeout(ctx, o.SyncTimeout)
	defer cancel()
	if !c.WaitForCacheSync(syncCtx) {
		return nil, nil, fmt.Errorf("kubernetes caches of %s did not sync within %v (is the API server reachable, and may this node list AddressPools, AddressBlocks and Namespaces?)", cfg.Host, o.SyncTimeout)
	}
	return c, stop, nil
}

// Describe names the API server and the local store.
// Volatile is the local store's unsynced tier (store.Tiered), nil when it
// has none.
func (s *Store) Volatile() store.Store {
	if t, ok := s.Store.(interface{ Volatile() store.Store }); ok {
		return t.Volatile()
	}
	return nil
}

func (s *Store) Describe() string {
	return fmt.Sprintf("kubernetes %s (node %s), attachments in %s", s.host, s.node, s.Store.Describe())
}

// Close stops the Lease's renewal (the Lease stays, and expires: the
// node's blocks are kept through a restart), the informers (not an
// injected Options.Cache) and closes the local store.
func (s *Store) Close() error {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	if s.lease != nil {
		s.lease.wait()
	}
	s.stop()
	return s.Store.Close()
}

// APIRequests returns how many API requests the Store has made: reads
// (GET, including lists and watches) and writes (everything else).
func (s *Store) APIRequests() (reads, writes uint64) {
	return s.m.reads.Load(), s.m.writes.Load()
}

// CreatePool refuses: pools come from the API.
func (s *Store) CreatePool(context.Context, store.Pool, func([]store.Pool) error) error {
	return ErrReadOnly
}

// DeletePool refuses: pools come from the API.
func (s *Store) DeletePool(context.Context, string, func([]store.Attachment) error) error {
	return ErrReadOnly
}

// GetPool reads the pool from the informer cache.
func (s *Store) GetPool(ctx context.Context, name string) (store.Pool, error) {
	p := &skeinv1.AddressPool{}
	if err := s.cache.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return store.Pool{}, fmt.Errorf("AddressPool %q: %w", name, store.ErrNotFound)
		}
		return store.Pool{}, fmt.Errorf("get AddressPool %q: %w", name, err)
	}
	return poolOf(p)
}

// ListPools lists the pools in the informer cache; a pool that cannot be
// read (a bad subnet the API's validation let through) is left out.
func (s *Store) ListPools(ctx context.Context) ([]store.Pool, error) {
	var list skeinv1.AddressPoolList
	if err := s.cache.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list AddressPools: %w", err)
	}
	out := make([]store.Pool, 0, len(list.Items))
	for i := range list.Items {
		if p, err := poolOf(&list.Items[i]); err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// poolOf converts an AddressPool; its subnets are AddressPool.Prefixes,
// in the order blocks are numbered everywhere.
func poolOf(p *skeinv1.AddressPool) (store.Pool, error) {
	prefixes, err := p.Prefixes()
	if err != nil {
		return store.Pool{}, err
	}
	return store.Pool{Name: p.Name, BlockSizeBits: int(p.Spec.BlockSizeBits), Reserved: p.Spec.Reserved,
		Created: p.CreationTimestamp.UTC(), UID: string(p.UID), Deleting: !p.DeletionTimestamp.IsZero(),
		MaxBlocksPerNode: p.Spec.MaxBlocks(), Subnets: prefixes}, nil
}

// PoolForNamespace returns the skein.dev/pool annotation of namespace ns:
// false when it has none. A namespace the informer cache has not seen (a
// namespace made a moment ago) is read from the API server: falling back
// to the default pool would put a tenant's pod in a pool that is not its
// own. An error when the namespace does not exist or cannot be read.
func (s *Store) PoolForNamespace(ctx context.Context, ns string) (string, bool, error) {
	n, err := s.namespace(ctx, ns, "its pool")
	if err != nil {
		return "", false, err
	}
	p, ok := n.Annotations[skeinv1.AnnotationPool]
	return p, ok && p != "", nil
}

// NamespaceLabels returns the labels of namespace ns (pod networks'
// namespaceSelector), read as PoolForNamespace reads the namespace: from
// the cache, live on a miss, an error when it cannot be read.
func (s *Store) NamespaceLabels(ctx context.Context, ns string) (map[string]string, error) {
	n, err := s.namespace(ctx, ns, "its labels")
	if err != nil {
		return nil, err
	}
	return n.Labels, nil
}

// namespace reads namespace ns from the cache, and from the API server
// when the cache has not seen it (a namespace made a moment ago).
func (s *Store) namespace(ctx context.Context, ns, what string) (*corev1.Namespace, error) {
	n := &corev1.Namespace{}
	err := s.cache.Get(ctx, client.ObjectKey{Name: ns}, n)
	if apierrors.IsNotFound(err) {
		s.m.liveReads.Inc()
		err = s.client.Get(ctx, client.ObjectKey{Name: ns}, n)
	}
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("namespace %q does not exist: %w", ns, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read namespace %q for %s: %w", ns, what, err)
	}
	return n, nil
}

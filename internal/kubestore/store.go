// Package kubestore is skeind's store in Kubernetes mode (--store
// kubernetes): pools and blocks live in the API server, attachments stay in
// the node's embedded store.
//
// Pools are AddressPool objects, read through an informer; skeind never
// writes them. A node's blocks are the AddressBlocks labelled
// skein.dev/node=<node>. When the node needs a block it creates a
// BlockRequest, waits (bounded) for skein-controller to carve the block,
// and deletes the request (GrantBlock); it frees a block by deleting it and
// removing its finalizer (ReleaseBlock). Everything a pod ADD or DEL reads
// comes from the informer caches and the local store, so while the node's
// blocks have room an ADD or DEL makes no API request at all; the
// skein_api_requests_total counter shows it.
package kubestore

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// DefaultGrantTimeout bounds the wait for skein-controller to answer a
// BlockRequest.
const DefaultGrantTimeout = 10 * time.Second

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
	// GrantTimeout bounds GrantBlock's wait; 0 = DefaultGrantTimeout.
	GrantTimeout time.Duration
	// SyncTimeout bounds the wait for the informer caches in New; 0 = 1 minute.
	SyncTimeout time.Duration
	// Cache, if set, is read instead of informers of the Store's own: many
	// Stores in one process (the scale benchmark's simulated nodes) can
	// share one. It must hold AddressPools, Namespaces, and the
	// AddressBlocks and BlockRequests of every node it serves (the Store
	// filters by its node's label); the caller starts it, waits for it to
	// sync, and stops it after closing the Stores. Nil: New starts
	// informers for this node alone, as skeind does.
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
}

var (
	_ store.Store       = (*Store)(nil)
	_ ipam.BlockGranter = (*Store)(nil)
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
	s := &Store{Store: o.Local, node: o.Node, host: cfg.Host, timeout: o.GrantTimeout, cache: c, client: cl, stop: stop, m: m}
	s.nodeOwner(ctx)
	return s, nil
}

// startCache starts informers for pools, namespaces, and node o.Node's
// blocks and requests, and waits until they have synced; stop ends them.
func startCache(ctx context.Context, cfg *rest.Config, o Options) (_ cache.Cache, stop context.CancelFunc, err error) {
	mine := labels.SelectorFromSet(labels.Set{skeinv1.LabelNode: o.Node})
	c, err := cache.New(cfg, cache.Options{
		Scheme: Scheme,
		ByObject: map[client.Object]cache.ByObject{
			&skeinv1.AddressBlock{}: {Label: mine},
			&skeinv1.BlockRequest{}: {Label: mine},
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes cache: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			stop()
		}
	}()
	for _, obj := range []client.Object{&skeinv1.AddressPool{}, &skeinv1.AddressBlock{}, &skeinv1.BlockRequest{}, &corev1.Namespace{}} {
		if _, err := c.GetInformer(runCtx, obj); err != nil {
			return nil, nil, fmt.Errorf("informer for %T: %w", obj, err)
		}
	}
	go c.Start(runCtx) //nolint:errcheck // ends with runCtx
	syncCtx, cancel := context.WithTimeout(ctx, o.SyncTimeout)
	defer cancel()
	if !c.WaitForCacheSync(syncCtx) {
		return nil, nil, fmt.Errorf("kubernetes caches of %s did not sync within %v (is the API server reachable, and may this node list AddressPools, AddressBlocks, BlockRequests and Namespaces?)", cfg.Host, o.SyncTimeout)
	}
	return c, stop, nil
}

// Describe names the API server and the local store.
func (s *Store) Describe() string {
	return fmt.Sprintf("kubernetes %s (node %s), attachments in %s", s.host, s.node, s.Store.Describe())
}

// Close stops the informers (not an injected Options.Cache) and closes
// the local store.
func (s *Store) Close() error {
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

// poolOf converts an AddressPool. Subnets are listed entry by entry, IPv4
// before IPv6, as the controller's geometry numbers blocks (ipam.NewGeometry
// pairs them the same way).
func poolOf(p *skeinv1.AddressPool) (store.Pool, error) {
	out := store.Pool{Name: p.Name, BlockSizeBits: int(p.Spec.BlockSizeBits), Reserved: p.Spec.Reserved,
		Created: p.CreationTimestamp.UTC()}
	for i, e := range p.Spec.Subnets {
		for _, sub := range []*string{e.IPv4, e.IPv6} {
			if sub == nil {
				continue
			}
			pr, err := netip.ParsePrefix(*sub)
			if err != nil {
				return store.Pool{}, fmt.Errorf("AddressPool %s: subnet %d: %w", p.Name, i, err)
			}
			out.Subnets = append(out.Subnets, pr)
		}
	}
	return out, nil
}

// PoolForNamespace returns the skein.dev/pool annotation of namespace ns,
// from the informer cache; false when the namespace is unknown or has none.
func (s *Store) PoolForNamespace(ctx context.Context, ns string) (string, bool) {
	n := &corev1.Namespace{}
	if err := s.cache.Get(ctx, client.ObjectKey{Name: ns}, n); err != nil {
		return "", false
	}
	p, ok := n.Annotations[skeinv1.AnnotationPool]
	return p, ok && p != ""
}

package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
)

// scheme knows the kinds the Watcher reads.
var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(skeinv1.AddToScheme(scheme))
}

// WatchOptions configures NewWatcher. Node, and Config or Cache, are
// required.
type WatchOptions struct {
	// Config reaches the API server (for a cache of the Watcher's own).
	Config *rest.Config
	// Cache, if set, is read instead of informers of the Watcher's own:
	// skeind shares one cache between its store, routing and egress. It
	// must hold what CacheObjects describes (every AddressBlock, every
	// Node, slimmed or not); the caller starts it and waits for it to sync
	// before NewWatcher, and stops it after Close.
	Cache cache.Cache
	// Node is this node's name: its blocks are not remote.
	Node string
	// SyncTimeout bounds the wait for the caches in NewWatcher; 0 = 1 minute.
	SyncTimeout time.Duration
	// Logger; nil = slog.Default().
	Logger *slog.Logger
}

// CacheObjects are the kinds a Watcher reads and how a cache may hold
// them, for a cache shared with others (WatchOptions.Cache): every
// AddressBlock (a zero ByObject: as it is, the cache's defaults), and
// every Node kept slim. A cache holding full Nodes works too.
func CacheObjects() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&skeinv1.AddressBlock{}: {},
		&skeinv1.AddressPool{}:  {},
		&corev1.Node{}:          {Transform: slimNode},
	}
}

// Watcher reads every AddressBlock and Node of the cluster from a cache
// (its own, or one shared with skeind's store and egress) and turns them
// into the remote blocks routes are wanted for. Reading it costs no API
// request: a change arrives as a watch event, and Snapshot reads memory.
//
// Nodes are kept slim (name, UID, the address annotation, the addresses):
// a Node object is mostly status the routes do not need, and a cluster has
// thousands. Node heartbeats, and block updates that do not move a route
// (finalizers, deletion while the node still holds the block), do not
// signal a change.
//
// A block's route leads to the node named in its nodeName, the owner the
// API server keeps immutable; only a block without one (made by the
// retired BlockRequest protocol, before its node adopts it) is routed to
// the node of its skein.dev/node label. A block whose label names
// another node than its nodeName is not routed at all (and logged once):
// labels are mutable, and a node that could relabel another's blocks
// must not draw their traffic.
type Watcher struct {
	node    string
	cache   cache.Cache
	stop    context.CancelFunc
	changed chan struct{}
	log     *slog.Logger
	// handlers are the event handlers on a shared cache's informers,
	// removed by Close.
	handlers []func() error

	mu      sync.Mutex
	refused map[string]string // block name → why it is not routed, as logged
}

// NodeInfo is what a Snapshot knows of one Node.
type NodeInfo struct {
	Name string
	UID  types.UID
	// Addrs are the node's underlay addresses (NodeAddresses).
	Addrs []netip.Addr
	// BadAnnotation is set when the node's skein.dev/node-address
	// annotation is invalid (Addrs are then its InternalIPs).
	BadAnnotation error
}

// Snapshot is the routing view of the cluster at one moment.
type Snapshot struct {
	// Remotes are the blocks of the other nodes, one per address family,
	// sorted by Block, then Name.
	Remotes []Remote
	// Nodes are the Node objects by name, this node's among them.
	Nodes map[string]NodeInfo
}

// NewWatcher starts the informers and waits until they have synced; with
// WatchOptions.Cache it reads that cache instead.
func NewWatcher(ctx context.Context, o WatchOptions) (_ *Watcher, err error) {
	if o.Config == nil && o.Cache == nil || o.Node == "" {
		return nil, errors.New("routing watcher: Node, and Config or Cache, are required")
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = time.Minute
	}
	c, own := o.Cache, o.Cache == nil
	if own {
		c, err = cache.New(o.Config, cache.Options{
			Scheme:           scheme,
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject:         configured(CacheObjects()),
		})
		if err != nil {
			return nil, fmt.Errorf("kubernetes cache: %w", err)
		}
	}
	runCtx, stop := context.WithCancel(context.Background())
	// GetInformer waits for a shared cache's informer to sync (one the
	// caller did not start would be started here): bounded too.
	syncCtx, cancel := context.WithTimeout(ctx, o.SyncTimeout)
	defer cancel()
	w := &Watcher{node: o.Node, cache: c, stop: stop, changed: make(chan struct{}, 1), log: logger(o.Logger), refused: map[string]string{}}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	for _, h := range []struct {
		obj      client.Object
		relevant func(old, new any) bool
	}{
		{&skeinv1.AddressBlock{}, blockChanged},
		{&skeinv1.AddressPool{}, poolChanged},
		{&corev1.Node{}, nodeChanged},
	} {
		inf, err := c.GetInformer(syncCtx, h.obj)
		if err != nil {
			return nil, fmt.Errorf("informer for %T: %w", h.obj, err)
		}
		relevant := h.relevant
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { w.kick() },
			UpdateFunc: func(old, new any) {
				if relevant(old, new) {
					w.kick()
				}
			},
			DeleteFunc: func(any) { w.kick() },
		})
		if err != nil {
			return nil, fmt.Errorf("event handler for %T: %w", h.obj, err)
		}
		if !own {
			w.handlers = append(w.handlers, func() error { return inf.RemoveEventHandler(reg) })
		}
	}
	if !own {
		return w, nil
	}
	go c.Start(runCtx) //nolint:errcheck // ends with runCtx
	if !c.WaitForCacheSync(syncCtx) {
		return nil, fmt.Errorf("kubernetes caches of %s did not sync within %v (is the API server reachable, and may this node list and watch Nodes and AddressBlocks?)", o.Config.Host, o.SyncTimeout)
	}
	return w, nil
}

// Close stops the informers of its own, or stops listening to a shared
// cache (which goes on).
func (w *Watcher) Close() {
	w.stop()
	for _, remove := range w.handlers {
		remove() //nolint:errcheck // fails only for a handler already gone
	}
	w.handlers = nil
}

// Changed receives a value after something that may move a route has
// changed; many changes may arrive as one.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

func (w *Watcher) kick() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Snapshot reads the cache. This node's blocks are left out, and so are
// blocks without an owner, blocks whose owner label disagrees with their
// nodeName (see Watcher), and slices that do not parse (the API's
// validation should have refused them). A block being deleted still gets
// its route: its node may hold addresses in it until it lets go.
func (w *Watcher) Snapshot(ctx context.Context) (Snapshot, error) {
	var nodes corev1.NodeList
	if err := w.cache.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return Snapshot{}, fmt.Errorf("list Nodes: %w", err)
	}
	var blocks skeinv1.AddressBlockList
	if err := w.cache.List(ctx, &blocks, client.UnsafeDisableDeepCopy); err != nil {
		return Snapshot{}, fmt.Errorf("list AddressBlocks: %w", err)
	}
	var pools skeinv1.AddressPoolList
	if err := w.cache.List(ctx, &pools, client.UnsafeDisableDeepCopy); err != nil {
		return Snapshot{}, fmt.Errorf("list AddressPools: %w", err)
	}
	return w.snapshotOf(nodes.Items, blocks.Items, pools.Items), nil
}

// poolChanged: a pool's spec (its subnets) decides its blocks' slices.
func poolChanged(old, new any) bool {
	o, ok1 := old.(*skeinv1.AddressPool)
	n, ok2 := new.(*skeinv1.AddressPool)
	return !ok1 || !ok2 || o.Generation != n.Generation
}

// slices are the pools' geometries, by name, to check blocks against.
type poolSlices map[string]*ipam.Geometry

func slicesOf(pools []skeinv1.AddressPool) poolSlices {
	out := make(poolSlices, len(pools))
	for i := range pools {
		if g, err := pools[i].Geometry(); err == nil {
			out[pools[i].Name] = g
		}
	}
	return out
}

// check says why b's slices are not the ones its pool and index give it
// ("" when they are, or for the families b does not list). A block's
// ipv4 and ipv6 are written by the node that claims it; only the pool
// and the index decide which slice is the block's, so a node that writes
// another node's slice into a block of its own (the AddressBlock webhook
// off) routes nothing.
func (ps poolSlices) check(b *skeinv1.AddressBlock) string {
	i := strings.LastIndexByte(b.Name, '-')
	if i <= 0 {
		return "its name is not <pool>-<index>"
	}
	pool := b.Name[:i]
	g := ps[pool]
	if g == nil {
		return fmt.Sprintf("its pool %q is unknown (or its subnets unreadable)", pool)
	}
	if b.Index < 0 || b.Index >= int64(g.Blocks()) {
		return fmt.Sprintf("its index %d is outside pool %q (%d blocks)", b.Index, pool, g.Blocks())
	}
	want4, want6 := g.BlockPrefixes(uint32(b.Index))
	for _, c := range []struct {
		got  *string
		want netip.Prefix
		fam  string
	}{{b.IPv4, want4, "ipv4"}, {b.IPv6, want6, "ipv6"}} {
		if c.got == nil {
			continue
		}
		p, err := netip.ParsePrefix(*c.got)
		if err != nil || p.Masked() != c.want {
			return fmt.Sprintf("its %s %s is not block %d of pool %q (%v)", c.fam, *c.got, b.Index, pool, c.want)
		}
	}
	return ""
}

// reserved reports whether b's pool reserves its whole slice of a family
// (b passed check).
func (ps poolSlices) reserved(b *skeinv1.AddressBlock, v6 bool) bool {
	g := ps[b.Name[:strings.LastIndexByte(b.Name, '-')]]
	return g.SliceReserved(uint32(b.Index), v6)
}

// snapshotOf builds a Snapshot from the cache's objects.
func (w *Watcher) snapshotOf(nodes []corev1.Node, blocks []skeinv1.AddressBlock, pools []skeinv1.AddressPool) Snapshot {
	geos := slicesOf(pools)
	snap := Snapshot{Nodes: make(map[string]NodeInfo, len(nodes)), Remotes: make([]Remote, 0, 2*len(blocks))}
	for i := range nodes {
		n := &nodes[i]
		addrs, bad := NodeAddresses(n)
		snap.Nodes[n.Name] = NodeInfo{Name: n.Name, UID: n.UID, Addrs: addrs, BadAnnotation: bad}
	}
	refused := map[string]string{}
	for i := range blocks {
		b := &blocks[i]
		node, why := BlockOwner(b)
		if why != "" {
			refused[b.Name] = why
			continue
		}
		if node == "" || node == w.node {
			continue
		}
		if why := geos.check(b); why != "" {
			refused[b.Name] = why
			continue
		}
		for _, s := range []*string{b.IPv4, b.IPv6} {
			if s == nil {
				continue
			}
			p, err := netip.ParsePrefix(*s)
			if err != nil {
				continue
			}
			// A slice whose every address the pool reserves is never
			// handed out: a block claimed for it (no honest node does)
			// would route the reserved range, VIPs and the like, to
			// that node.
			if geos.reserved(b, p.Addr().Is6()) {
				refused[b.Name] = fmt.Sprintf("its %s slice %s is reserved whole by its pool", map[bool]string{false: "ipv4", true: "ipv6"}[p.Addr().Is6()], p.Masked())
				continue
			}
			snap.Remotes = append(snap.Remotes, Remote{Block: p.Masked(), Name: b.Name, Node: node, NodeAddrs: snap.Nodes[node].Addrs})
		}
	}
	w.logRefused(refused)
	// By block, then name: of two blocks claiming one prefix, the same
	// one wins every time (Sync routes the first).
	slices.SortFunc(snap.Remotes, func(a, b Remote) int {
		return cmp.Or(a.Block.Addr().Compare(b.Block.Addr()), cmp.Compare(a.Block.Bits(), b.Block.Bits()), strings.Compare(a.Name, b.Name))
	})
	return snap
}

// BlockOwner is the node a block's routes lead to: its nodeName, or for a
// block without one (the retired BlockRequest protocol) its
// skein.dev/node label; "" when it has neither. why says why a block is
// not routed at all: its label names another node than its nodeName.
func BlockOwner(b *skeinv1.AddressBlock) (node, why string) {
	label := b.Labels[skeinv1.LabelNode]
	switch {
	case b.NodeName == "":
		return label, ""
	case label != "" && label != b.NodeName:
		return "", fmt.Sprintf("its label %s=%s disagrees with its nodeName %s", skeinv1.LabelNode, label, b.NodeName)
	}
	return b.NodeName, ""
}

// logRefused logs each block newly refused (or refused for a new reason)
// once, and forgets the blocks that are fine again or gone.
func (w *Watcher) logRefused(now map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, why := range now {
		if w.refused[name] != why {
			w.log.Warn("routing: AddressBlock not routed: "+why, "block", name)
		}
	}
	w.refused = now
}

// Self returns this node's Node, false when the cache has none.
func (w *Watcher) Self(ctx context.Context) (NodeInfo, bool) {
	n := &corev1.Node{}
	if err := w.cache.Get(ctx, client.ObjectKey{Name: w.node}, n); err != nil {
		return NodeInfo{}, false
	}
	addrs, bad := NodeAddresses(n)
	return NodeInfo{Name: n.Name, UID: n.UID, Addrs: addrs, BadAnnotation: bad}, true
}

// slimNode keeps of a Node what routing reads.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Node{}
	slim.Name, slim.UID, slim.ResourceVersion = n.Name, n.UID, n.ResourceVersion
	if v, ok := n.Annotations[skeinv1.AnnotationNodeAddress]; ok {
		slim.Annotations = map[string]string{skeinv1.AnnotationNodeAddress: v}
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			slim.Status.Addresses = append(slim.Status.Addresses, a)
		}
	}
	return slim, nil
}

func nodeChanged(old, new any) bool {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := new.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return o.UID != n.UID || !maps.Equal(o.Annotations, n.Annotations) || !slices.Equal(o.Status.Addresses, n.Status.Addresses)
}

func blockChanged(old, new any) bool {
	o, ok1 := old.(*skeinv1.AddressBlock)
	n, ok2 := new.(*skeinv1.AddressBlock)
	if !ok1 || !ok2 {
		return true
	}
	return o.Labels[skeinv1.LabelNode] != n.Labels[skeinv1.LabelNode] || o.NodeName != n.NodeName ||
		!ptrEqual(o.IPv4, n.IPv4) || !ptrEqual(o.IPv6, n.IPv6)
}

func ptrEqual(a, b *string) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// logger is the default for a nil *slog.Logger option.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// configured leaves out the kinds without options: cache.New resolves
// every kind of ByObject at once, and one whose CRD is missing should fail
// where it is watched, with a message that says so.
func configured(objs map[client.Object]cache.ByObject) map[client.Object]cache.ByObject {
	out := map[client.Object]cache.ByObject{}
	for obj, o := range objs {
		if o.Namespaces != nil || o.Label != nil || o.Field != nil || o.Transform != nil || o.UnsafeDisableDeepCopy != nil ||
			o.EnableWatchBookmarks != nil || o.SyncPeriod != nil {
			out[obj] = o
		}
	}
	return out
}

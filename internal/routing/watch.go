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
)

// scheme knows the kinds the Watcher reads.
var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(skeinv1.AddToScheme(scheme))
}

// WatchOptions configures NewWatcher. Config and Node are required.
type WatchOptions struct {
	// Config reaches the API server.
	Config *rest.Config
	// Node is this node's name: its blocks are not remote.
	Node string
	// SyncTimeout bounds the wait for the caches in NewWatcher; 0 = 1 minute.
	SyncTimeout time.Duration
}

// Watcher holds every AddressBlock and Node of the cluster in a cache of
// its own (kubestore's holds only this node's blocks) and turns them into
// the remote blocks routes are wanted for. Reading it costs no API
// request: a change arrives as a watch event, and Snapshot reads memory.
//
// Nodes are kept slim (name, UID, the address annotation, the addresses):
// a Node object is mostly status the routes do not need, and a cluster has
// thousands. Node heartbeats, and block updates that do not move a route
// (finalizers, deletion while the node still holds the block), do not
// signal a change.
type Watcher struct {
	node    string
	cache   cache.Cache
	stop    context.CancelFunc
	changed chan struct{}
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
	// sorted by Block.
	Remotes []Remote
	// Nodes are the Node objects by name, this node's among them.
	Nodes map[string]NodeInfo
}

// NewWatcher starts the informers and waits until they have synced.
func NewWatcher(ctx context.Context, o WatchOptions) (_ *Watcher, err error) {
	if o.Config == nil || o.Node == "" {
		return nil, errors.New("routing watcher: Config and Node are required")
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = time.Minute
	}
	c, err := cache.New(o.Config, cache.Options{
		Scheme:           scheme,
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Node{}: {Transform: slimNode},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes cache: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			stop()
		}
	}()
	w := &Watcher{node: o.Node, cache: c, stop: stop, changed: make(chan struct{}, 1)}
	for _, h := range []struct {
		obj      client.Object
		relevant func(old, new any) bool
	}{
		{&skeinv1.AddressBlock{}, blockChanged},
		{&corev1.Node{}, nodeChanged},
	} {
		inf, err := c.GetInformer(runCtx, h.obj)
		if err != nil {
			return nil, fmt.Errorf("informer for %T: %w", h.obj, err)
		}
		relevant := h.relevant
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { w.kick() },
			UpdateFunc: func(old, new any) {
				if relevant(old, new) {
					w.kick()
				}
			},
			DeleteFunc: func(any) { w.kick() },
		}); err != nil {
			return nil, fmt.Errorf("event handler for %T: %w", h.obj, err)
		}
	}
	go c.Start(runCtx) //nolint:errcheck // ends with runCtx
	syncCtx, cancel := context.WithTimeout(ctx, o.SyncTimeout)
	defer cancel()
	if !c.WaitForCacheSync(syncCtx) {
		return nil, fmt.Errorf("kubernetes caches of %s did not sync within %v (is the API server reachable, and may this node list and watch Nodes and AddressBlocks?)", o.Config.Host, o.SyncTimeout)
	}
	return w, nil
}

// Close stops the informers.
func (w *Watcher) Close() { w.stop() }

// Changed receives a value after something that may move a route has
// changed; many changes may arrive as one.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

func (w *Watcher) kick() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Snapshot reads the cache. Blocks whose node label is this node's, or
// missing, are left out; so are slices that do not parse (the API's
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
	snap := Snapshot{Nodes: make(map[string]NodeInfo, len(nodes.Items)), Remotes: make([]Remote, 0, 2*len(blocks.Items))}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		addrs, bad := NodeAddresses(n)
		snap.Nodes[n.Name] = NodeInfo{Name: n.Name, UID: n.UID, Addrs: addrs, BadAnnotation: bad}
	}
	for i := range blocks.Items {
		b := &blocks.Items[i]
		node := b.Labels[skeinv1.LabelNode]
		if node == "" || node == w.node {
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
			snap.Remotes = append(snap.Remotes, Remote{Block: p.Masked(), Name: b.Name, Node: node, NodeAddrs: snap.Nodes[node].Addrs})
		}
	}
	slices.SortFunc(snap.Remotes, func(a, b Remote) int {
		return cmp.Or(a.Block.Addr().Compare(b.Block.Addr()), cmp.Compare(a.Block.Bits(), b.Block.Bits()))
	})
	return snap, nil
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
	return o.Labels[skeinv1.LabelNode] != n.Labels[skeinv1.LabelNode] ||
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

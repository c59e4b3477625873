package kubescale

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// A real skeind's informer runs its Store's AddressBlock handler for every
// block event, on the node's own CPU. Sharing one informer, the simulated
// nodes would run a thousand handlers per event in this process (every
// Store registers its own), four million calls for 4,000 blocks, which is
// CPU the API server does not get. kubestore's handler acts only on blocks
// that are, or were, its own node's (nodeName or the skein.dev/node label):
// for any other block it forgets nothing it had and tells the Manager
// nothing. So the dispatcher registers one handler on the shared informer
// and hands each event to the handlers of the nodes it names, old and new
// object alike: every Store still runs its own handler on every event
// that can change what it knows.

// dispatcher routes AddressBlock events to the nodes they concern.
type dispatcher struct {
	shared cache.Cache
	mu     sync.RWMutex
	byNode map[string][]*dispatchReg
}

type dispatchReg struct {
	node   string
	h      toolscache.ResourceEventHandler
	synced atomic.Bool
}

func (r *dispatchReg) HasSynced() bool { return r.synced.Load() }

// newDispatcher registers the dispatcher on the shared cache's AddressBlock
// informer and waits until it has seen what the informer holds.
func newDispatcher(ctx context.Context, shared cache.Cache) (*dispatcher, error) {
	d := &dispatcher{shared: shared, byNode: map[string][]*dispatchReg{}}
	inf, err := shared.GetInformer(ctx, &skeinv1.AddressBlock{})
	if err != nil {
		return nil, err
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			for _, r := range d.regs(nodesOf(o)) {
				r.h.OnAdd(o, false)
			}
		},
		UpdateFunc: func(old, o any) {
			for _, r := range d.regs(append(nodesOf(old), nodesOf(o)...)) {
				r.h.OnUpdate(old, o)
			}
		},
		DeleteFunc: func(o any) {
			for _, r := range d.regs(nodesOf(o)) {
				r.h.OnDelete(o)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	for !reg.HasSynced() {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return d, nil
}

// nodesOf names the nodes a block event concerns.
func nodesOf(o any) []string {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	b, ok := o.(*skeinv1.AddressBlock)
	if !ok {
		return nil
	}
	var out []string
	for _, n := range []string{b.NodeName, b.Labels[skeinv1.LabelNode]} {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// regs returns the handlers of nodes, each once.
func (d *dispatcher) regs(nodes []string) []*dispatchReg {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var out []*dispatchReg
	for i, n := range nodes {
		if slices.Contains(nodes[:i], n) {
			continue
		}
		out = append(out, d.byNode[n]...)
	}
	return out
}

// register adds node's handler h: first the blocks of node the cache holds
// now, as an informer gives a new handler its initial adds, then every
// event concerning node. Events are held while it registers, so none is
// lost between the two (one may come twice: kubestore's handler is
// idempotent).
func (d *dispatcher) register(node string, h toolscache.ResourceEventHandler) (*dispatchReg, error) {
	r := &dispatchReg{node: node, h: h}
	d.mu.Lock()
	defer d.mu.Unlock()
	var list skeinv1.AddressBlockList
	if err := d.shared.List(context.Background(), &list); err != nil {
		return nil, fmt.Errorf("list AddressBlocks: %w", err)
	}
	for i := range list.Items {
		b := &list.Items[i]
		if slices.Contains(nodesOf(b), node) {
			h.OnAdd(b, true)
		}
	}
	d.byNode[node] = append(d.byNode[node], r)
	r.synced.Store(true)
	return r, nil
}

func (d *dispatcher) unregister(r *dispatchReg) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.byNode[r.node] = slices.DeleteFunc(d.byNode[r.node], func(x *dispatchReg) bool { return x == r })
}

// nodeCache is the shared cache as node's Store sees it: the same reads,
// and its handlers on AddressBlocks registered with the dispatcher.
type nodeCache struct {
	cache.Cache
	node string
	d    *dispatcher
}

func (c *nodeCache) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	inf, err := c.Cache.GetInformer(ctx, obj, opts...)
	if _, ok := obj.(*skeinv1.AddressBlock); !ok || err != nil {
		return inf, err
	}
	return &nodeInformer{Informer: inf, node: c.node, d: c.d}, nil
}

type nodeInformer struct {
	cache.Informer
	node string
	d    *dispatcher
}

func (i *nodeInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.d.register(i.node, h)
}

func (i *nodeInformer) AddEventHandlerWithResyncPeriod(h toolscache.ResourceEventHandler, _ time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.d.register(i.node, h)
}

func (i *nodeInformer) AddEventHandlerWithOptions(h toolscache.ResourceEventHandler, _ toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	return i.d.register(i.node, h)
}

func (i *nodeInformer) RemoveEventHandler(reg toolscache.ResourceEventHandlerRegistration) error {
	if r, ok := reg.(*dispatchReg); ok {
		i.d.unregister(r)
		return nil
	}
	return i.Informer.RemoveEventHandler(reg)
}

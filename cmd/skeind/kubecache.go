package main

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/podegress"
	"github.com/skeinnet/skein/internal/routing"
)

// One informer cache per skeind in Kubernetes mode: the store (kubestore),
// routing and the egress client read the same one, so each kind is
// listed and watched once per node. Before, each kept its own: two
// AddressPool and two AddressBlock watches per node, and every block event
// reached three caches on every node of the cluster.
//
// What it holds, and who reads it:
//
//	AddressPools     every one          store, egress
//	AddressBlocks    every one          store (its own; the next store picks free indices among all), routing
//	Namespaces       every one          store (a pod's pool)
//	Nodes            every one, slim    routing
//	Pods             this node's only   egress (field selector spec.nodeName)
//	Services         egress.skein.dev/name-labelled  egress
//	Egresses         every one          egress
//
// Every object is kept without its managedFields (Nodes and Pods only
// with the few fields read).

// kubeScheme knows every kind the cache holds.
var kubeScheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(kubeScheme))
	utilruntime.Must(skeinv1.AddToScheme(kubeScheme))
}

// cacheKind is one kind of the shared cache.
type cacheKind struct {
	obj  client.Object
	opts cache.ByObject
	// resource is what RBAC must allow to get, list and watch.
	resource string
	// readers name the parts of skeind that read it.
	readers []string
	// hint is added to an error watching it.
	hint string
	// lazy kinds are not started with the cache: a reader's first Get or
	// List starts them.
	lazy bool
}

// cacheKinds are the kinds of the shared cache of node; egress adds the
// egress client's.
func cacheKinds(node string, egress bool) ([]cacheKind, error) {
	var kinds []cacheKind
	add := func(reader string, objs map[client.Object]cache.ByObject, lazy bool) error {
		for obj, o := range objs {
			i := slices.IndexFunc(kinds, func(k cacheKind) bool { return reflect.TypeOf(k.obj) == reflect.TypeOf(obj) })
			if i < 0 {
				kinds = append(kinds, cacheKind{obj: obj, opts: o, resource: resourceOf(obj), readers: []string{reader}, lazy: lazy})
				continue
			}
			k := &kinds[i]
			switch {
			case !hasOptions(o):
			case !hasOptions(k.opts):
				k.opts = o
			default:
				// Two readers with their own selectors or transforms: one
				// would miss objects or fields. Never in skeind as built.
				return fmt.Errorf("shared kubernetes cache: %s and %s both configure %T", strings.Join(k.readers, ", "), reader, obj)
			}
			k.readers = append(k.readers, reader)
			k.lazy = k.lazy && lazy
		}
		return nil
	}
	// What kubestore reads (see kubestore.Options.Cache). Every
	// AddressBlock: the cache serves routing too, and a node claiming
	// blocks itself looks at every block of a pool.
	store := map[client.Object]cache.ByObject{
		&skeinv1.AddressPool{}:  {},
		&skeinv1.AddressBlock{}: {},
		&corev1.Namespace{}:     {},
	}
	if err := add("store", store, false); err != nil {
		return nil, err
	}
	if err := add("routing", routing.CacheObjects(), false); err != nil {
		return nil, err
	}
	if egress {
		if err := add("egress", podegress.CacheObjects(node), false); err != nil {
			return nil, err
		}
	}
	for i := range kinds {
		if _, ok := kinds[i].obj.(*skeinv1.Egress); ok {
			kinds[i].hint = "is the Egress CRD installed? skeind --egress=false does without"
		}
	}
	return kinds, nil
}

func hasOptions(o cache.ByObject) bool {
	return o.Namespaces != nil || o.Label != nil || o.Field != nil || o.Transform != nil || o.UnsafeDisableDeepCopy != nil ||
		o.EnableWatchBookmarks != nil || o.SyncPeriod != nil
}

// resourceOf names obj's resource for RBAC ("addressblocks.skein.dev",
// "nodes").
func resourceOf(obj client.Object) string {
	kind := strings.ToLower(reflect.TypeOf(obj).Elem().Name())
	plural := kind + "s"
	if strings.HasSuffix(kind, "s") {
		plural = kind + "es"
	}
	if gvks, _, err := kubeScheme.ObjectKinds(obj); err == nil && gvks[0].Group != "" {
		return plural + "." + gvks[0].Group
	}
	return plural
}

// sharedCache is the running cache.
type sharedCache struct {
	cache.Cache
	stop context.CancelFunc
}

// startCache starts the shared cache of node with kinds on rc, and waits
// (at most timeout) until every kind started has synced. The error of a
// cache that does not sync names the kinds that did not, the last error
// listing or watching each, and the RBAC skeind needs.
func startCache(ctx context.Context, rc *rest.Config, kinds []cacheKind, timeout time.Duration) (_ *sharedCache, err error) {
	errs := &watchErrors{last: map[string]error{}}
	byObject := map[client.Object]cache.ByObject{}
	for _, k := range kinds {
		// A kind without options is left to the defaults: cache.New
		// resolves every kind of ByObject at once, and a missing CRD
		// should fail where it is watched, with its hint.
		if hasOptions(k.opts) {
			byObject[k.obj] = k.opts
		}
	}
	c, err := cache.New(rc, cache.Options{
		Scheme:                   kubeScheme,
		DefaultTransform:         cache.TransformStripManagedFields(),
		DefaultWatchErrorHandler: errs.record,
		ByObject:                 byObject,
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
	type started struct {
		kind cacheKind
		inf  cache.Informer
	}
	var infs []started
	for _, k := range kinds {
		if k.lazy {
			continue
		}
		inf, err := c.GetInformer(runCtx, k.obj)
		if err != nil {
			if k.hint != "" {
				return nil, fmt.Errorf("watch %s (%s): %w", k.resource, k.hint, err)
			}
			return nil, fmt.Errorf("watch %s: %w", k.resource, err)
		}
		infs = append(infs, started{k, inf})
	}
	go c.Start(runCtx) //nolint:errcheck // ends with runCtx
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if c.WaitForCacheSync(syncCtx) {
		return &sharedCache{Cache: c, stop: stop}, nil
	}
	var missing, need []string
	for _, s := range infs {
		need = append(need, s.kind.resource)
		if s.inf.HasSynced() {
			continue
		}
		m := fmt.Sprintf("%s (read by %s)", s.kind.resource, strings.Join(s.kind.readers, " and "))
		if err := errs.of(s.kind.obj); err != nil {
			m += ": " + err.Error()
		}
		if s.kind.hint != "" {
			m += " (" + s.kind.hint + ")"
		}
		missing = append(missing, m)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kubernetes cache of %s: %w", rc.Host, err)
	}
	return nil, fmt.Errorf("kubernetes cache of %s did not sync within %v: %s; skeind needs get, list and watch of %s (is the API server reachable? see deploy/kubernetes/skeind-rbac.yaml)",
		rc.Host, timeout, strings.Join(missing, "; "), strings.Join(need, ", "))
}

// watchErrors keeps the last error listing or watching each kind.
type watchErrors struct {
	mu   sync.Mutex
	last map[string]error // by the reflector's type description ("*v1.Node")
}

func (w *watchErrors) record(ctx context.Context, r *toolscache.Reflector, err error) {
	w.mu.Lock()
	w.last[r.TypeDescription()] = err
	w.mu.Unlock()
	toolscache.DefaultWatchErrorHandler(ctx, r, err)
}

func (w *watchErrors) of(obj client.Object) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err, ok := w.last[fmt.Sprintf("%T", obj)]; ok {
		return err
	}
	// Another description than expected: say every error seen.
	var all []error
	for d, err := range w.last {
		all = append(all, fmt.Errorf("%s: %w", d, err))
	}
	return errors.Join(all...)
}

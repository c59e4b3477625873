package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// Stats are a data plane's figures at one moment (egress.RouterStats).
type Stats struct {
	Tunnels          int    // tunnel devices to clients
	Peers            int    // client addresses synced
	ConntrackEntries int    // NAT connections tracked
	Packets, Bytes   uint64 // forwarded between tunnels and outside (nftables counters)
	NATConnections   uint64 // connections masqueraded
	// DroppedSource and DroppedDestination count packets out of the
	// tunnels dropped for a source not their client's and for a
	// destination not the Egress's.
	DroppedSource, DroppedDestination uint64
}

// Dataplane is the router side of the data plane, as internal/egress's
// Router implements it. SyncPeers is given the whole wanted set (sorted,
// unique, only families the router has an address of) and is safe to
// repeat; after an error some peers may lack a tunnel, and the next call
// tries again. Close removes everything the data plane made. None of them
// is called concurrently with another.
//
// SyncDestinations sets the destinations the data plane forwards to from
// its tunnels (the Egress's spec.destinations, both families; a new data
// plane forwards nowhere until it is called); it refuses a malformed
// prefix, changing nothing.
type Dataplane interface {
	SyncPeers(peers []netip.Addr) error
	SyncDestinations(dsts []netip.Prefix) error
	Stats() (Stats, error)
	Close() error
}

// DataplaneConfig is what a Dataplane is opened with; its fields are
// those of egress.RouterConfig, so one converts to the other.
type DataplaneConfig struct {
	NetNS          string     // "" = the current network namespace
	Port           int        // FoU port; 0 means the library's default (5555)
	Local4, Local6 netip.Addr // the router pod's own addresses; zero = family off
	OutInterface   string     // where SNAT'd traffic leaves; "" = "eth0"
	SourcePortAuto bool       // tunnels send from a port per flow
}

// Opener makes a data plane; Run calls it once the Egress is known, and
// again when the Egress's fouSourcePort changes (after closing the old).
// Its error ends Run: a router that cannot program its kernel is better
// restarted, visibly, than left half-working.
type Opener func(DataplaneConfig) (Dataplane, error)

// Options configures New. Config, Namespace, Name and Open are required;
// the zero value of the others is a default.
type Options struct {
	Config          *rest.Config // the API server
	Namespace, Name string       // the Egress this router serves
	// Dataplane is the configuration of the data plane; SourcePortAuto
	// is not read: it follows the Egress's spec.fouSourcePort.
	Dataplane DataplaneConfig
	Open      Opener
	// Coalesce is how long a change waits for more before the data plane
	// hears of them; 0 means 20 ms.
	Coalesce time.Duration
	// Resync is the time between syncs of the whole set when nothing
	// changed (repairs a data plane disturbed from outside); 0 means a
	// minute.
	Resync time.Duration
	// MinBackoff and MaxBackoff bound the wait before a failed sync is
	// tried again (doubling); 0 means 100 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// SyncTimeout bounds the wait for an informer's first list (the
	// Egress's at the start, a served namespace's pods when it comes);
	// 0 means two minutes.
	SyncTimeout time.Duration
	// Log; nil means slog.Default().
	Log *slog.Logger
}

// Agent keeps one router's data plane in step with the API.
type Agent struct {
	o     Options
	peers *peerSet
	pods  *podInformers // started by Run
	kick  chan struct{}
	m     *metrics

	dpMu  sync.Mutex
	dp    Dataplane // nil until the Egress is known
	dpCfg DataplaneConfig
	// dests are the destinations dp was last given; nil for a data plane
	// not given any yet.
	dests []netip.Prefix
	// serves is the namespaces' filter of the last sync (Egress.Serves).
	serves func(namespace string) bool
	// watched are the namespaces whose pods are watched (nil until the
	// Egress is known; step's alone).
	watched []string
	// waitLogged: "waiting for the Egress" was logged (once is enough).
	waitLogged bool
	ready      atomic.Bool
	problem    atomic.Pointer[string] // why not ready, or the last sync error
}

// New checks o and fills in its defaults.
func New(o Options) (*Agent, error) {
	if o.Config == nil || o.Namespace == "" || o.Name == "" || o.Open == nil {
		return nil, errors.New("egress router: Config, Namespace, Name and Open are required")
	}
	if !o.Dataplane.Local4.IsValid() && !o.Dataplane.Local6.IsValid() {
		return nil, errors.New("egress router: the router has no address of its own (neither IPv4 nor IPv6)")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Coalesce, 20*time.Millisecond)
	def(&o.Resync, time.Minute)
	def(&o.MinBackoff, 100*time.Millisecond)
	def(&o.MaxBackoff, 30*time.Second)
	def(&o.SyncTimeout, 2*time.Minute)
	if o.Log == nil {
		o.Log = slog.Default()
	}
	a := &Agent{o: o, peers: newPeerSet(o.Namespace, o.Name), kick: make(chan struct{}, 1)}
	a.m = newMetrics(a)
	a.setProblem("informers not synced yet")
	return a, nil
}

// scheme knows Pods and Egresses.
var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(skeinv1.AddToScheme(scheme))
}

// Run follows the API until ctx ends, then closes the data plane and
// returns nil. It returns an error when the informers do not sync, when
// the data plane cannot be opened, or when closing it fails.
func (a *Agent) Run(ctx context.Context) (err error) {
	// The informers live as long as Run, also when it ends with an error
	// and the caller's context goes on.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := a.startCache(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	cs, err := kubernetes.NewForConfig(a.o.Config)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	a.pods = &podInformers{
		cs:    cs,
		strip: func(p *corev1.Pod) *corev1.Pod { return Strip(p, a.o.Namespace) },
		handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { a.podChanged(obj) },
			UpdateFunc: func(_, obj any) { a.podChanged(obj) },
			DeleteFunc: a.podDeleted,
		},
		forget: a.peers.forget,
		byNS:   map[string]*podInformer{},
	}
	defer a.pods.stop()
	defer func() {
		a.dpMu.Lock()
		defer a.dpMu.Unlock()
		if a.dp != nil {
			if cerr := a.dp.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("close the data plane: %w", cerr))
			}
			a.dp = nil
		}
	}()
	a.setProblem("waiting for Egress " + a.o.Namespace + "/" + a.o.Name)
	resync := time.NewTicker(a.o.Resync)
	defer resync.Stop()
	backoff := time.Duration(0)
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.kick:
			// More changes tend to follow one (a rollout, a pod's IPs
			// and phase): let them gather.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(a.o.Coalesce):
			}
			select {
			case <-a.kick:
			default:
			}
		case <-resync.C:
		case <-retry:
		}
		retry = nil
		if err := a.step(ctx, c); err != nil {
			var fatal *fatalError
			if errors.As(err, &fatal) {
				return fatal.err
			}
			a.m.syncErrors.Inc()
			backoff = min(max(2*backoff, a.o.MinBackoff), a.o.MaxBackoff)
			a.setProblem(err.Error())
			a.o.Log.Error("sync the data plane; retrying", "err", err, "in", backoff)
			retry = time.After(backoff)
			continue
		}
		backoff = 0
	}
}

// fatalError ends Run.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// step reads the Egress, (re)opens the data plane if its source port mode
// changed, and syncs the peer set.
func (a *Agent) step(ctx context.Context, c cache.Cache) error {
	eg := &skeinv1.Egress{}
	err := c.Get(ctx, client.ObjectKey{Namespace: a.o.Namespace, Name: a.o.Name}, eg)
	switch {
	case apierrors.IsNotFound(err):
		eg = nil
	case err != nil:
		return fmt.Errorf("read Egress %s/%s: %w", a.o.Namespace, a.o.Name, err)
	}
	// The pods of the namespaces the Egress serves (with the Egress gone,
	// those it served last), listed before the data plane hears of them;
	// outside dpMu, which the metrics take.
	var podsErr error
	if eg != nil {
		a.watched = watchedNamespaces(eg)
	}
	if a.watched != nil {
		if podsErr = a.pods.ensure(ctx, a.watched, a.o.SyncTimeout); podsErr != nil && ctx.Err() != nil {
			return nil
		}
	}
	a.dpMu.Lock()
	defer a.dpMu.Unlock()
	if eg == nil && a.dp == nil {
		if !a.waitLogged {
			a.o.Log.Info("waiting for the Egress", "egress", a.o.Namespace+"/"+a.o.Name)
			a.waitLogged = true
		}
		return nil // its creation kicks the loop
	}
	if eg != nil {
		cfg := a.o.Dataplane
		cfg.SourcePortAuto = eg.Spec.FoUSourcePort == skeinv1.FoUSourcePortAuto
		if a.dp == nil || cfg != a.dpCfg {
			if a.dp != nil {
				a.o.Log.Info("the Egress's fouSourcePort changed: reopening the data plane", "auto", cfg.SourcePortAuto)
				if err := a.dp.Close(); err != nil {
					return &fatalError{fmt.Errorf("close the data plane: %w", err)}
				}
				a.dp = nil
			}
			dp, err := a.o.Open(cfg)
			if err != nil {
				return &fatalError{fmt.Errorf("open the data plane: %w", err)}
			}
			a.dp, a.dpCfg, a.dests = dp, cfg, nil
			a.o.Log.Info("data plane open", "local4", cfg.Local4, "local6", cfg.Local6, "port", cfg.Port,
				"outInterface", cfg.OutInterface, "sourcePortAuto", cfg.SourcePortAuto)
		}
	}
	// The destinations before the peers: the router forwards from its
	// tunnels only to them. A list the data plane refuses (or one that
	// does not parse, which the API's validation should not let through)
	// leaves the last one in place; the peers are synced all the same,
	// and the error makes the step count as failed (retried, logged).
	var destErr error
	if eg != nil {
		dsts, err := destinations(eg)
		if err == nil && (a.dests == nil || !slices.Equal(dsts, a.dests)) {
			if err = a.dp.SyncDestinations(dsts); err == nil {
				a.dests = dsts
				a.o.Log.Info("destinations set", "destinations", dsts)
			}
		}
		if err != nil {
			destErr = fmt.Errorf("destinations of Egress %s/%s: %w", a.o.Namespace, a.o.Name, err)
		}
	}
	// Only pods of the namespaces the Egress serves are peers: another
	// namespace's pod annotated for it is no client (its packets are
	// dropped as a stranger's). With the Egress gone (deleted, its routers
	// not yet), the namespaces it served last.
	serves := a.serves
	if serves == nil {
		serves = func(ns string) bool { return ns == a.o.Namespace }
	}
	if eg != nil {
		serves = eg.Serves
	}
	a.serves = serves
	addrs, pods := a.peers.snapshot(serves)
	peers := a.families(addrs)
	start := time.Now()
	if err := a.dp.SyncPeers(peers); err != nil {
		return errors.Join(podsErr, destErr, fmt.Errorf("sync %d peers of %d client pods: %w", len(peers), pods, err))
	}
	if err := errors.Join(podsErr, destErr); err != nil {
		return err
	}
	a.o.Log.Debug("synced", "peers", len(peers), "pods", pods, "took", time.Since(start))
	if !a.ready.Swap(true) {
		a.o.Log.Info("first sync done: ready", "peers", len(peers), "pods", pods)
	}
	a.problem.Store(nil)
	return nil
}

// destinations parses eg's spec.destinations (never nil: an empty list
// is an empty slice, so that it differs from "not given yet").
func destinations(eg *skeinv1.Egress) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(eg.Spec.Destinations))
	for _, d := range eg.Spec.Destinations {
		p, err := netip.ParsePrefix(d)
		if err != nil {
			return nil, fmt.Errorf("destination %q: %w", d, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// families keeps the addresses of the families the router has an
// address of: a tunnel needs a local end of the same family.
func (a *Agent) families(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, p := range addrs {
		if p.Is4() && a.o.Dataplane.Local4.IsValid() || p.Is6() && a.o.Dataplane.Local6.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

func (a *Agent) setProblem(s string) { a.problem.Store(&s) }

// Ready reports whether the data plane has been synced once.
func (a *Agent) Ready() bool { return a.ready.Load() }

func (a *Agent) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// startCache starts the informer on the one Egress (listed and watched by
// name, which is all the router's account may read of egresses) and
// waits for its first list. The pod informers follow in step, once the
// Egress says which namespaces it serves.
func (a *Agent) startCache(ctx context.Context) (cache.Cache, error) {
	c, err := cache.New(a.o.Config, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&skeinv1.Egress{}: {
				Namespaces: map[string]cache.Config{a.o.Namespace: {}},
				Field:      fields.OneTermEqualSelector("metadata.name", a.o.Name),
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes cache: %w", err)
	}
	egs, err := c.GetInformer(ctx, &skeinv1.Egress{})
	if err != nil {
		return nil, fmt.Errorf("egress informer: %w", err)
	}
	if _, err := egs.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.poke() },
		UpdateFunc: func(any, any) { a.poke() },
		DeleteFunc: func(any) { a.poke() },
	}); err != nil {
		return nil, fmt.Errorf("egress handler: %w", err)
	}
	go c.Start(ctx) //nolint:errcheck // ends with ctx
	syncCtx, cancel := context.WithTimeout(ctx, a.o.SyncTimeout)
	defer cancel()
	if !c.WaitForCacheSync(syncCtx) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("Egress %s/%s not listed within %v (is the API server %s reachable, and may this router get, list and watch it?)",
			a.o.Namespace, a.o.Name, a.o.SyncTimeout, a.o.Config.Host)
	}
	a.poke() // the first sync, also with no client at all
	return c, nil
}

func (a *Agent) podChanged(obj any) {
	if p, ok := obj.(*corev1.Pod); ok && a.peers.update(p) {
		a.poke()
	}
}

func (a *Agent) podDeleted(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok && a.peers.remove(podKey(p)) {
		a.poke()
	}
}

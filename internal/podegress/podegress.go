package podegress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/internal/keylock"
	"github.com/skeinnet/skein/internal/store"
)

// Reasons of the Warning events recorded on Pods.
const (
	// ReasonEgressNotFound: an Egress the pod names, or its Service or
	// the Service's ClusterIP, does not exist.
	ReasonEgressNotFound = "EgressNotFound"
	// ReasonEgressFailed: the tunnels could not be set up in the pod.
	ReasonEgressFailed = "EgressFailed"
)

// Applier converges a pod's network namespace (a path such as
// /var/run/netns/x) to cfg: the zero config removes everything. It must
// be idempotent and leave the namespace as it was on error
// (egress.ApplyClient's contract). Calls for one pod never overlap; calls
// for different pods may.
type Applier interface {
	Apply(netnsPath string, cfg egress.ClientConfig) error
}

// ApplierFunc adapts a function (egress.ApplyClient) to Applier.
type ApplierFunc func(netnsPath string, cfg egress.ClientConfig) error

// Apply calls f.
func (f ApplierFunc) Apply(netnsPath string, cfg egress.ClientConfig) error { return f(netnsPath, cfg) }

// Eventer records Warning events on an object (routing.NodeEvents).
type Eventer interface {
	Warning(obj runtime.Object, reason, message string)
}

// Options configures New. Config, Node and Applier are required.
type Options struct {
	// Config reaches the API server.
	Config *rest.Config
	// Cache, if set, is read instead of informers of the Client's own:
	// skeind shares one cache between its store, routing and egress. It
	// must hold what CacheObjects(Node) describes; the caller starts it
	// and waits for it to sync before New, and stops it after Close.
	Cache cache.Cache
	// Node is this node's name: its pods are those with spec.nodeName
	// equal to it.
	Node string
	// Applier programs pods' namespaces.
	Applier Applier
	// Events records Warning events on Pods; nil = none.
	Events Eventer
	// Attachments lists the node's attachments, so that pods attached
	// before skeind started are found again (by their addresses); nil =
	// they are not followed until their next ADD.
	Attachments func(ctx context.Context) ([]store.Attachment, error)
	// Logger; nil = slog.Default().
	Logger *slog.Logger
	// SyncTimeout bounds the wait for the informer caches in New; 0 =
	// one minute.
	SyncTimeout time.Duration
}

// Client keeps this node's pods' egress tunnels. Its methods are safe for
// concurrent use.
type Client struct {
	o      Options
	log    *slog.Logger
	cache  cache.Cache
	api    client.Reader
	queue  workqueue.TypedRateLimitingInterface[types.NamespacedName]
	locks  keylock.Locks
	stop   context.CancelFunc
	done   chan struct{}
	closed sync.Once

	mu   sync.Mutex
	pods map[types.NamespacedName]*podState
	m    *metrics
	// handlers are the event handlers on a shared cache's informers,
	// removed by Close.
	handlers []func() error
}

// podState is what the Client knows of one pod attached on this node.
type podState struct {
	containerID string
	netns       string
	// ifName is the interface whose ADD made the state: only its DEL
	// removes the tunnels (another interface of the pod may come and go);
	// "" (found again after a restart) = any.
	ifName string
	// applied is the configuration the namespace has; known is false
	// for a pod found again after a restart until it is first applied.
	applied egress.ClientConfig
	known   bool
	// problem is the last Warning recorded, not repeated while it stays;
	// failed likewise for the last failed re-apply.
	problem, failed string
	// gateways is len(applied.Gateways), guarded by Client.mu (metrics).
	gateways int
}

var _ daemon.PodHook = (*Client)(nil)

// Scheme knows the kinds the Client reads.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(skeinv1.AddToScheme(Scheme))
}

// CacheObjects are the kinds a Client of node reads and how a cache must
// hold them, for a cache shared with others (Options.Cache): the pods of
// node alone (a field selector) kept slim, the Services labelled
// egress.skein.dev/name (the Egresses'), every Egress and AddressPool (a
// zero ByObject: as they are, the cache's defaults).
func CacheObjects(node string) map[client.Object]cache.ByObject {
	labelled, err := labels.NewRequirement(skeinv1.LabelEgress, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant key: cannot fail
	}
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}:          {Field: fields.OneTermEqualSelector("spec.nodeName", node), Transform: slimPod},
		&corev1.Service{}:      {Label: labels.NewSelector().Add(*labelled)},
		&skeinv1.Egress{}:      {},
		&skeinv1.AddressPool{}: {},
	}
}

// New starts informers for this node's pods, the Egresses and their
// Services (those labelled egress.skein.dev/name), waits until they have
// synced, and starts following the pods; with Options.Cache it reads that
// cache instead. Close stops it.
func New(ctx context.Context, o Options) (_ *Client, err error) {
	if o.Config == nil || o.Node == "" || o.Applier == nil {
		return nil, errors.New("podegress: Config, Node and Applier are required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = time.Minute
	}
	api, err := client.New(o.Config, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	c, own := o.Cache, o.Cache == nil
	if own {
		c, err = cache.New(o.Config, cache.Options{
			Scheme:           Scheme,
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject:         configured(CacheObjects(o.Node)),
		})
		if err != nil {
			return nil, fmt.Errorf("kubernetes cache: %w", err)
		}
	}
	runCtx, stop := context.WithCancel(context.Background())
	cl := &Client{
		o: o, log: o.Logger, cache: c, api: api, stop: stop, done: make(chan struct{}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "egress-pods"}),
		pods: map[types.NamespacedName]*podState{},
	}
	cl.m = newMetrics(cl)
	defer func() {
		if err != nil {
			stop()
			cl.queue.ShutDown()
			cl.removeHandlers()
		}
	}()
	// GetInformer waits for a shared cache's informer to sync (one the
	// caller did not start would be started here): bounded too.
	syncCtx, cancel := context.WithTimeout(ctx, o.SyncTimeout)
	defer cancel()
	if err := cl.watch(syncCtx, !own); err != nil {
		return nil, err
	}
	if own {
		go c.Start(runCtx) //nolint:errcheck // ends with runCtx
		if !c.WaitForCacheSync(syncCtx) {
			return nil, fmt.Errorf("egress: kubernetes caches of %s did not sync within %v (may this node list and watch Pods, Services, Egresses and AddressPools?)", o.Config.Host, o.SyncTimeout)
		}
	}
	go cl.run(runCtx)
	return cl, nil
}

// Close stops following pods; the tunnels stay. A shared cache goes on.
func (c *Client) Close() {
	c.closed.Do(func() {
		c.removeHandlers()
		c.stop()
		c.queue.ShutDown()
		<-c.done
	})
}

func (c *Client) removeHandlers() {
	for _, remove := range c.handlers {
		remove() //nolint:errcheck // fails only for a handler already gone
	}
	c.handlers = nil
}

// Added sets up the tunnels of a pod just attached: it reads the Pod
// (cache, else the API), resolves every Egress it names and applies. A
// gateway that cannot be resolved, or a failed Apply, is an error (with a
// Warning event on the Pod) and leaves nothing in the namespace; an
// unresolved gateway is CNI code 11 (try again later: it may appear). A
// pod naming no Egress, or without a Pod object, needs no Apply.
func (c *Client) Added(ctx context.Context, ref daemon.PodRef) error {
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	defer c.locks.Lock(key.String())()
	st := &podState{containerID: ref.ContainerID, netns: ref.NetNS, ifName: ref.IfName, known: true}
	// Another interface of a sandbox already followed: the state stays
	// its first interface's, and what that applied is converged too.
	had := false
	c.mu.Lock()
	if prev := c.pods[key]; prev != nil && prev.containerID == ref.ContainerID {
		st.ifName, had = prev.ifName, !prev.known || len(prev.applied.Gateways) > 0
	}
	c.mu.Unlock()
	pod, err := c.getPod(ctx, key)
	if apierrors.IsNotFound(err) {
		c.remember(key, st) // not a Kubernetes pod after all: nothing to do
		return nil
	}
	if err != nil { // the API unreachable: transient too
		return cnitypes.NewError(cnitypes.ErrTryAgainLater, fmt.Sprintf("egress of pod %s: read the Pod: %v", key, err), "")
	}
	cfg, problems := c.desired(ctx, pod)
	if len(problems) > 0 {
		// Code 11: the runtime retries, and the gateway may appear.
		msg := fmt.Sprintf("egress of pod %s: %v", key, errors.Join(problems...))
		c.warn(pod, ReasonEgressNotFound, msg)
		return cnitypes.NewError(cnitypes.ErrTryAgainLater, msg, "")
	}
	if len(cfg.Gateways) > 0 || had {
		if err := c.apply(ref.NetNS, cfg); err != nil {
			err = fmt.Errorf("egress of pod %s: %w", key, err)
			c.warn(pod, ReasonEgressFailed, err.Error())
			return err
		}
		st.applied, st.gateways = cfg, len(cfg.Gateways)
	}
	c.remember(key, st)
	return nil
}

// Deleting removes the pod's tunnels (best effort, when its namespace is
// still there and it may have any; only on the DEL of the interface whose
// ADD set them up) and runs detach, holding the pod's lock so that no
// re-apply runs in between.
func (c *Client) Deleting(ctx context.Context, ref daemon.PodRef, detach func() error) error {
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	defer c.locks.Lock(key.String())()
	c.mu.Lock()
	st := c.pods[key]
	c.mu.Unlock()
	mine := st == nil || st.containerID == ref.ContainerID && (st.ifName == "" || st.ifName == ref.IfName)
	if mine && ref.NetNS != "" && (st == nil || !st.known || len(st.applied.Gateways) > 0) {
		if err := c.apply(ref.NetNS, egress.ClientConfig{}); err != nil {
			c.log.Warn("egress: remove the tunnels of a deleted pod (its namespace goes with it)", "pod", key, "err", err)
		}
	}
	if err := detach(); err != nil {
		return err
	}
	if mine {
		c.forget(key, ref.ContainerID)
	}
	return nil
}

func (c *Client) remember(key types.NamespacedName, st *podState) {
	c.mu.Lock()
	c.pods[key] = st
	c.mu.Unlock()
}

// forget drops the pod's state if it is still container id's ("" = any).
func (c *Client) forget(key types.NamespacedName, id string) {
	c.mu.Lock()
	if st := c.pods[key]; st != nil && (id == "" || st.containerID == id) {
		delete(c.pods, key)
	}
	c.mu.Unlock()
}

// getPod reads the Pod from the cache, or from the API when the cache has
// not seen it yet (a pod scheduled a moment ago).
func (c *Client) getPod(ctx context.Context, key types.NamespacedName) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	err := c.cache.Get(ctx, key, pod)
	if apierrors.IsNotFound(err) {
		err = c.api.Get(ctx, key, pod)
	}
	return pod, err
}

// desired is the configuration of the pod's annotations; problems name
// each gateway that cannot be resolved (left out of the configuration).
func (c *Client) desired(ctx context.Context, pod *corev1.Pod) (cfg egress.ClientConfig, problems []error) {
	for _, k := range Wanted(pod.Annotations) {
		eg := &skeinv1.Egress{}
		if err := c.cache.Get(ctx, k, eg); err != nil {
			if apierrors.IsNotFound(err) {
				err = fmt.Errorf("Egress %s not found", k)
			}
			problems = append(problems, err)
			continue
		}
		if eg.DeletionTimestamp != nil {
			problems = append(problems, fmt.Errorf("Egress %s is being deleted", k))
			continue
		}
		if !eg.Serves(pod.Namespace) {
			// The annotation is the pod owner's to write: it never
			// decides alone.
			problems = append(problems, fmt.Errorf("Egress %s does not serve pods of namespace %q (its spec.clientNamespaces)", k, pod.Namespace))
			continue
		}
		svc := &corev1.Service{}
		if err := c.cache.Get(ctx, k, svc); err != nil {
			if apierrors.IsNotFound(err) {
				err = fmt.Errorf("Service %s of Egress %s not found (skein-controller makes it)", k, k)
			}
			problems = append(problems, err)
			continue
		}
		gw, err := GatewayOf(eg, svc)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		cfg.Gateways = append(cfg.Gateways, gw)
	}
	if len(cfg.Gateways) > 0 {
		cfg.InCluster = c.inCluster(ctx)
	}
	return cfg, problems
}

// inCluster is every AddressPool's subnets, sorted and without
// duplicates: the cluster's pod networks, which never go through a
// gateway even when they are not private ranges. More than
// egress.MaxInCluster are cut there (with a log line): the rest would
// only go through the gateway.
func (c *Client) inCluster(ctx context.Context) []netip.Prefix {
	var l skeinv1.AddressPoolList
	if err := c.cache.List(ctx, &l); err != nil {
		c.log.Warn("egress: list AddressPools", "err", err)
		return nil
	}
	var out []netip.Prefix
	for _, p := range l.Items {
		for _, s := range p.Spec.Subnets {
			for _, cidr := range []*string{s.IPv4, s.IPv6} {
				if cidr == nil {
					continue
				}
				if n, err := netip.ParsePrefix(*cidr); err == nil && n.Bits() > 0 {
					out = append(out, n.Masked())
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if x := a.Addr().Compare(b.Addr()); x != 0 {
			return x
		}
		return a.Bits() - b.Bits()
	})
	out = slices.Compact(out)
	if len(out) > egress.MaxInCluster {
		c.log.Warn("egress: more AddressPool subnets than in-cluster rules; the rest may go through gateways", "subnets", len(out), "max", egress.MaxInCluster)
		out = out[:egress.MaxInCluster]
	}
	return out
}

// apply calls the Applier, logging how long it took.
func (c *Client) apply(netnsPath string, cfg egress.ClientConfig) error {
	start := time.Now()
	err := c.o.Applier.Apply(netnsPath, cfg)
	c.m.observe(time.Since(start), err)
	c.log.Debug("egress: applied", "netns", netnsPath, "gateways", len(cfg.Gateways), "took", time.Since(start), "err", err)
	if err != nil {
		return fmt.Errorf("apply %d gateway(s) in %s: %w", len(cfg.Gateways), netnsPath, err)
	}
	return nil
}

// slimPod keeps of a cached Pod what the Client reads: its identity (for
// events), its egress annotations, hostNetwork, its addresses and phase.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{}
	slim.Namespace, slim.Name, slim.UID, slim.ResourceVersion = p.Namespace, p.Name, p.UID, p.ResourceVersion
	slim.DeletionTimestamp = p.DeletionTimestamp
	for k, v := range p.Annotations {
		if strings.HasPrefix(k, skeinv1.AnnotationEgressPrefix) {
			if slim.Annotations == nil {
				slim.Annotations = map[string]string{}
			}
			slim.Annotations[k] = v
		}
	}
	slim.Spec.NodeName, slim.Spec.HostNetwork = p.Spec.NodeName, p.Spec.HostNetwork
	slim.Status.PodIPs, slim.Status.Phase = p.Status.PodIPs, p.Status.Phase
	return slim, nil
}

func (c *Client) warn(pod *corev1.Pod, reason, msg string) {
	if c.o.Events != nil {
		c.o.Events.Warning(pod, reason, msg)
	}
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

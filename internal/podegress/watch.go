package podegress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/internal/netns"
)

// Following running pods: every change of one of this node's pods queues
// that pod; every change of an Egress or of its Service queues the local
// pods that name it. One worker drains the queue (a pod queued twice is
// synced once), each sync under the pod's lock, failures retried with
// backoff.

// watch adds the event handlers (remembered for Close when the cache is
// shared).
func (c *Client) watch(ctx context.Context, shared bool) error {
	handle := func(obj client.Object, h toolscache.ResourceEventHandler) error {
		inf, err := c.cache.GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return err
		}
		if shared {
			c.handlers = append(c.handlers, func() error { return inf.RemoveEventHandler(reg) })
		}
		return nil
	}
	if err := handle(&corev1.Pod{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.queuePod(obj, false) },
		UpdateFunc: func(old, obj any) {
			o, n := old.(*corev1.Pod), obj.(*corev1.Pod)
			if !samePodView(o, n) {
				c.queuePod(obj, false)
			}
		},
		DeleteFunc: func(obj any) { c.queuePod(obj, true) },
	}); err != nil {
		return fmt.Errorf("egress: watch Pods: %w", err)
	}
	for _, obj := range []client.Object{&skeinv1.Egress{}, &corev1.Service{}} {
		if err := handle(obj, toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.queueUsers(obj) },
			UpdateFunc: func(_, obj any) { c.queueUsers(obj) },
			DeleteFunc: func(obj any) { c.queueUsers(obj) },
		}); err != nil {
			return fmt.Errorf("egress: watch %T (is the Egress CRD installed? skeind --egress=false does without): %w", obj, err)
		}
	}
	if err := handle(&skeinv1.AddressPool{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.queueFollowed() },
		UpdateFunc: func(old, obj any) {
			// The pool's status (usage, conditions) changes with every
			// block claimed anywhere in the cluster; only its subnets
			// matter here.
			if !sameSubnets(old, obj) {
				c.queueFollowed()
			}
		},
		DeleteFunc: func(any) { c.queueFollowed() },
	}); err != nil {
		return fmt.Errorf("egress: watch AddressPools: %w", err)
	}
	return nil
}

// sameSubnets: two versions of an AddressPool with the same subnets (all
// the Client reads of a pool).
func sameSubnets(old, obj any) bool {
	o, ok1 := old.(*skeinv1.AddressPool)
	n, ok2 := obj.(*skeinv1.AddressPool)
	return ok1 && ok2 && reflect.DeepEqual(o.Spec.Subnets, n.Spec.Subnets)
}

// queueFollowed queues every followed pod that has gateways: an
// AddressPool changed, and with it their in-cluster networks (a sync
// that finds nothing different applies nothing).
func (c *Client) queueFollowed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, st := range c.pods {
		if st.gateways > 0 {
			c.queue.Add(k)
		}
	}
}

// samePodView: nothing the Client reads of the pod changed (its
// annotations, its addresses).
func samePodView(a, b *corev1.Pod) bool {
	if len(a.Annotations) != len(b.Annotations) || !slices.Equal(a.Status.PodIPs, b.Status.PodIPs) {
		return false
	}
	for k, v := range a.Annotations {
		if w, ok := b.Annotations[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func keyOf(obj any) (types.NamespacedName, bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}, true
}

func (c *Client) queuePod(obj any, deleted bool) {
	key, ok := keyOf(obj)
	if !ok {
		return
	}
	if deleted {
		// Its DEL removes the tunnels (and finds nothing here, which is
		// fine); this only stops following it.
		c.forget(key, "")
		return
	}
	c.queue.Add(key)
}

// queueUsers queues the local pods naming the Egress of obj (an Egress,
// or its Service: same namespace and name).
func (c *Client) queueUsers(obj any) {
	key, ok := keyOf(obj)
	if !ok {
		return
	}
	var l corev1.PodList
	if err := c.cache.List(context.Background(), &l); err != nil {
		c.log.Warn("egress: list this node's pods", "err", err)
		return
	}
	for i := range l.Items {
		p := &l.Items[i]
		c.mu.Lock()
		_, known := c.pods[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}]
		c.mu.Unlock()
		if slices.Contains(Wanted(p.Annotations), key) || known && HasEgress(p.Annotations) {
			c.queue.Add(types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		}
	}
}

// run is the worker; it ends when the queue shuts down.
func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	for {
		key, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		if ctx.Err() != nil { // closed: what is still queued is dropped
			c.queue.Done(key)
			continue
		}
		c.m.syncs.Inc()
		if err := c.sync(ctx, key); err != nil {
			c.log.Warn("egress: re-apply a pod's tunnels; retrying", "pod", key, "err", err)
			c.queue.AddRateLimited(key)
		} else {
			c.queue.Forget(key)
		}
		c.queue.Done(key)
	}
}

// sync converges one running pod to its annotations. A pod this Client
// has not attached (before a restart) is found again by its addresses; a
// gateway that cannot be resolved is a Warning event, the others applied.
func (c *Client) sync(ctx context.Context, key types.NamespacedName) error {
	defer c.locks.Lock(key.String())()
	pod := &corev1.Pod{}
	if err := c.cache.Get(ctx, key, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // deleted: its DEL cleans up
		}
		return err
	}
	c.mu.Lock()
	st := c.pods[key]
	c.mu.Unlock()
	if st == nil {
		if st = c.recover(ctx, pod); st == nil {
			return nil
		}
	}
	cfg, problems := c.desired(ctx, pod)
	problem := ""
	if len(problems) > 0 {
		// Fail closed, as ADD does: a gateway the pod still names but
		// that cannot be resolved now keeps its last tunnel, so its
		// destinations go nowhere rather than out directly.
		if st.known {
			cfg = keepUnresolved(cfg, st.applied, Wanted(pod.Annotations))
		}
		problem = errors.Join(problems...).Error()
		if problem != st.problem {
			c.warn(pod, ReasonEgressNotFound, "egress of pod "+key.String()+": "+problem+
				"; its last tunnel stays until it is back or the annotation drops it (its destinations are not sent directly), the pod's other gateways stay")
		}
	}
	st.problem = problem
	if st.known && sameConfig(cfg, st.applied) {
		return nil
	}
	if netns.IsNetNS(st.netns) != nil {
		c.forget(key, st.containerID) // the sandbox is gone; DEL follows
		return nil
	}
	if err := c.apply(st.netns, cfg); err != nil {
		// Retried with backoff: one event while the failure stays the same.
		if msg := "egress of pod " + key.String() + ": " + err.Error(); msg != st.failed {
			c.warn(pod, ReasonEgressFailed, msg)
			st.failed = msg
		}
		return err
	}
	st.failed = ""
	c.mu.Lock()
	st.applied, st.known, st.gateways = cfg, true, len(cfg.Gateways)
	c.mu.Unlock()
	return nil
}

// recover finds the attachment of a pod ADDed before this Client started,
// by the pod's addresses. A pod naming no Egress is found too (and so
// gets the zero configuration once): its annotation may have been removed
// while skeind was down, leaving its tunnels. A finished or terminating
// pod is not: its addresses may already be another pod's. Nil when there
// is none, or when the attachment is already another pod's.
func (c *Client) recover(ctx context.Context, pod *corev1.Pod) *podState {
	if c.o.Attachments == nil || pod.Spec.HostNetwork || len(pod.Status.PodIPs) == 0 ||
		pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	atts, err := c.o.Attachments(ctx)
	if err != nil {
		c.log.Warn("egress: list attachments", "err", err)
		return nil
	}
	for _, a := range atts {
		for _, pip := range pod.Status.PodIPs {
			ip, err := netip.ParseAddr(pip.IP)
			if err != nil || !slices.Contains(a.Addrs, ip) || a.NetNS == "" || c.followed(a.ContainerID) {
				continue
			}
			st := &podState{containerID: a.ContainerID, netns: a.NetNS}
			c.remember(types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, st)
			return st
		}
	}
	return nil
}

// followed reports whether a pod's state already holds container id.
func (c *Client) followed(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.pods {
		if st.containerID == id {
			return true
		}
	}
	return false
}

// keepUnresolved adds to cfg the gateways of applied that the pod still
// wants but cfg lacks (they could not be resolved), in the order ADD
// uses: by namespace and name.
func keepUnresolved(cfg, applied egress.ClientConfig, wanted []types.NamespacedName) egress.ClientConfig {
	has := func(gws []egress.Gateway, k types.NamespacedName) bool {
		return slices.ContainsFunc(gws, func(g egress.Gateway) bool { return g.Namespace == k.Namespace && g.Name == k.Name })
	}
	out := egress.ClientConfig{Gateways: slices.Clone(cfg.Gateways), InCluster: cfg.InCluster}
	for _, g := range applied.Gateways {
		k := types.NamespacedName{Namespace: g.Namespace, Name: g.Name}
		if slices.Contains(wanted, k) && !has(out.Gateways, k) {
			out.Gateways = append(out.Gateways, g)
		}
	}
	slices.SortFunc(out.Gateways, func(a, b egress.Gateway) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

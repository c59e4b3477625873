package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/routing"
)

// routingKernel is what skeind needs of the kernel side of routing
// (*kernel.Kernel).
type routingKernel interface {
	routing.Syncer
	Close() error
}

// nodeRouting is routing between nodes, running: the watcher of the
// cluster's blocks and nodes, the kernel side, and the loop between them.
type nodeRouting struct {
	loop    *routing.Loop
	watcher *routing.Watcher
	events  *routing.NodeEvents
	kernel  routingKernel
	cancel  context.CancelFunc
	done    chan struct{}
}

// cleanLeftovers is export mode on the embedded store: nothing to route,
// but routes, rules and the VXLAN device another mode left in the kernel
// (skeind ran with --routing direct or vxlan before) go.
func cleanLeftovers(ctx context.Context, cfg daemon.Config, log *slog.Logger) {
	k, _, err := openKernel(routing.ModeExport, cfg, nil)
	if err != nil {
		log.Warn("routing: cannot look for routes of other routing modes", "err", err)
		return
	}
	defer k.Close()
	if _, err := k.Sync(ctx, nil); err != nil {
		log.Warn("routing: remove routes of other routing modes", "err", err)
	}
}

// startRouting sets up routing between nodes in Kubernetes mode: the
// cluster's view (read from the shared cache c), this node's address (published on its Node when
// --node-address is given), the kernel side, and the loop, which becomes
// cfg.Routes. In vxlan mode with --mtu 0 it sets the pod MTU to the
// device's. The loop runs once run is called; stop undoes everything.
func startRouting(ctx context.Context, cfg *daemon.Config, mode routing.Mode, rc *rest.Config, c cache.Cache, log *slog.Logger) (_ *nodeRouting, err error) {
	r := &nodeRouting{done: make(chan struct{})}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.watcher, err = routing.NewWatcher(ctx, routing.WatchOptions{Config: rc, Cache: c, Node: cfg.Node, Logger: log}); err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	var local []netip.Addr
	if cfg.Routing.NodeAddress != "" {
		local, _ = routing.ParseNodeAddresses(cfg.Routing.NodeAddress) // validated before
	} else if self, ok := r.watcher.Self(ctx); ok {
		local = self.Addrs
	}
	if mode == routing.ModeVXLAN && len(local) == 0 {
		return nil, fmt.Errorf("--routing vxlan needs this node's underlay address: give --node-address, or an InternalIP on Node %q", cfg.Node)
	}
	k, mtu, err := openKernel(mode, *cfg, local)
	if err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	r.kernel = k
	if mode == routing.ModeVXLAN {
		podMTU, err := vxlanPodMTU(cfg.Dataplane.MTU, mtu)
		if err != nil {
			return nil, err
		}
		if podMTU != cfg.Dataplane.MTU {
			cfg.Dataplane.MTU = podMTU
			log.Info("routing: pod MTU lowered for the VXLAN overlay", "mtu", podMTU)
		}
		if mtu < minIPv6MTU {
			log.Warn("routing: the VXLAN device's MTU is below IPv6's minimum: the kernel disables IPv6 on it, so IPv6 pod traffic cannot cross nodes; "+
				"raise the underlay's MTU or give --vxlan-mtu", "mtu", mtu, "min", minIPv6MTU)
		}
	}
	// Published once the kernel side is up: a skeind that fails at start
	// leaves the Node as it was.
	if cfg.Routing.NodeAddress != "" {
		if err := publishNodeAddress(ctx, rc, cfg.Node, local); err != nil {
			if !apierrors.IsNotFound(err) {
				return nil, err
			}
			log.Warn("routing: no Node object for this node; peers cannot learn --node-address", "node", cfg.Node)
		}
	}
	if r.events, err = routing.NewNodeEvents(rc, cfg.Node); err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	lo := routing.LoopOptions{Mode: mode, Source: r.watcher, Syncer: k, Events: r.events, Logger: log}
	if cfg.Routing.NodeAddress == "" {
		lo.SelfNode = cfg.Node // follow the Node's address as peers do
	}
	if r.loop, err = routing.NewLoop(lo); err != nil {
		return nil, err
	}
	cfg.Routes = r.loop
	log.Info("routing between nodes", "mode", mode, "node-address", local)
	return r, nil
}

// run starts the loop; it stops with stop (or ctx).
func (r *nodeRouting) run(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	go func() {
		defer close(r.done)
		r.loop.Run(ctx) //nolint:errcheck // ends with ctx
	}()
}

// stop ends the loop and releases everything; kernel routes stay (a
// restart rebuilds the same state).
func (r *nodeRouting) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
	r.close()
}

func (r *nodeRouting) close() {
	if r.events != nil {
		r.events.Close()
	}
	if r.kernel != nil {
		r.kernel.Close()
	}
	if r.watcher != nil {
		r.watcher.Close()
	}
}

// publishNodeAddress writes addrs as node's skein.dev/node-address
// annotation (a merge patch touching nothing else), so peers learn it.
func publishNodeAddress(ctx context.Context, rc *rest.Config, node string, addrs []netip.Addr) error {
	cs, err := typedcorev1.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, skeinv1.AnnotationNodeAddress, strings.Join(s, ","))
	_, err = cs.Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "skeind"})
	if err != nil {
		return fmt.Errorf("annotate Node %s with %s=%s: %w", node, skeinv1.AnnotationNodeAddress, strings.Join(s, ","), err)
	}
	return nil
}

// minIPv6MTU is IPv6's minimum link MTU (RFC 8200).
const minIPv6MTU = 1280

// vxlanPodMTU is the pod MTU in vxlan mode given --mtu (podMTU, 0 = auto)
// and the VXLAN device's MTU: the device's when podMTU is 0; podMTU when
// it fits in the device; an error when it is larger (pods would send
// packets the overlay drops between nodes).
func vxlanPodMTU(podMTU, devMTU int) (int, error) {
	switch {
	case podMTU == 0:
		return devMTU, nil
	case podMTU > devMTU:
		return 0, fmt.Errorf("--mtu %d is larger than the VXLAN device's MTU %d (its underlay's MTU less the VXLAN overhead, or --vxlan-mtu): "+
			"pod packets that large would be dropped between nodes; give --mtu %d or less, or 0", podMTU, devMTU, devMTU)
	}
	return podMTU, nil
}

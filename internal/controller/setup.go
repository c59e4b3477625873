package controller

import (
	"fmt"
	"time"

	"github.com/skeinnet/skein/internal/egresscontroller"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Options configures Setup. The zero value is usable.
type Options struct {
	// GCInterval is the time between sweeps for what nodes gone for good
	// left; zero means DefaultGCInterval.
	GCInterval time.Duration
	// NodeGCGrace is how long past its Lease's end a node whose Node is
	// gone keeps its blocks; zero means DefaultNodeGCGrace.
	NodeGCGrace time.Duration
	// LeaseNamespace holds the nodes' liveness Leases; "" means
	// DefaultLeaseNamespace.
	LeaseNamespace string
	// RequestMaxAge: BlockRequests older than this are deleted; zero
	// means DefaultRequestMaxAge.
	RequestMaxAge time.Duration
	// PoolStatusInterval is the least time between two status writes of
	// one pool; zero means DefaultPoolStatusInterval.
	PoolStatusInterval time.Duration
	// EgressImage is the image of Egress router pods; "" means
	// egresscontroller.DefaultImage.
	EgressImage string
}

// Setup registers all of skein-controller's reconcilers with mgr: pool
// status and finalizer, Egress gateways, and the garbage collection of
// nodes gone for good. They run only while mgr leads, if it elects a
// leader.
func Setup(mgr ctrl.Manager, opts Options) error {
	reader := mgr.GetAPIReader()
	pools := &AddressPoolReconciler{Client: mgr.GetClient(), Reader: reader, StatusInterval: opts.PoolStatusInterval}
	if err := pools.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the AddressPool reconciler: %w", err)
	}
	eg := &egresscontroller.Reconciler{
		Client: mgr.GetClient(), Reader: reader, Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("skein-controller"), Image: opts.EgressImage,
	}
	if err := eg.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the Egress reconciler: %w", err)
	}
	gc := &NodeGCReconciler{
		Client: mgr.GetClient(), Reader: reader, Interval: opts.GCInterval,
		LeaseNamespace: opts.LeaseNamespace, Grace: opts.NodeGCGrace, RequestMaxAge: opts.RequestMaxAge,
	}
	if err := gc.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the node garbage collector: %w", err)
	}
	return nil
}

package controller

import (
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Options configures Setup. The zero value is usable.
type Options struct {
	// GCInterval is the time between sweeps for blocks and requests of
	// deleted nodes; zero means 10 minutes.
	GCInterval time.Duration
	// BlockRequestWorkers is how many BlockRequests are served at once;
	// zero means DefaultBlockRequestWorkers.
	BlockRequestWorkers int
	// EgressImage is the image of Egress router pods; "" means
	// DefaultEgressImage.
	EgressImage string
}

// DefaultBlockRequestWorkers is Options.BlockRequestWorkers' default.
const DefaultBlockRequestWorkers = 4

// Setup registers all of skein-controller's reconcilers with mgr: block
// requests, pool status and finalizer, Egress gateways, and the garbage collection of
// deleted nodes. They run only while mgr leads, if it elects a leader.
func Setup(mgr ctrl.Manager, opts Options) error {
	reader := mgr.GetAPIReader()
	workers := opts.BlockRequestWorkers
	if workers <= 0 {
		workers = DefaultBlockRequestWorkers
	}
	if err := (&BlockRequestReconciler{Client: mgr.GetClient(), Reader: reader, Workers: workers}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the BlockRequest reconciler: %w", err)
	}
	if err := (&AddressPoolReconciler{Client: mgr.GetClient(), Reader: reader}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the AddressPool reconciler: %w", err)
	}
	eg := &EgressReconciler{
		Client: mgr.GetClient(), Reader: reader, Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("skein-controller"), Image: opts.EgressImage,
	}
	if err := eg.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the Egress reconciler: %w", err)
	}
	gc := &NodeGCReconciler{Client: mgr.GetClient(), Reader: reader, Interval: opts.GCInterval}
	if err := gc.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the node garbage collector: %w", err)
	}
	return nil
}

package egresscontroller

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/skeinnet/skein/test/kube"
)

func init() { ctrl.SetLogger(logr.Discard()) }

// Options are what the tests choose of the Reconciler.
type Options struct {
	// EgressImage is the router pods' image ("" = DefaultImage).
	EgressImage string
}

// startAll runs a manager with the Egress reconciler, wired as
// skein-controller wires it (controller.Setup), until the test ends,
// without leader election. The manager must stop within its grace
// period, like the binary's.
func startAll(t *testing.T, env *kube.Env, opts Options) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 kube.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("skein-controller"), Image: opts.EgressImage,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// eventually waits up to 30 s for cond to return "".
func eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	kube.Eventually(t, 30*time.Second, what, cond)
}

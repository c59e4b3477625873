package egresscontroller

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

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
	kube.StartManager(t, env, func(mgr ctrl.Manager) error {
		r := &Reconciler{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
			Recorder: mgr.GetEventRecorder("skein-controller"), Image: opts.EgressImage,
		}
		return r.SetupWithManager(mgr)
	})
}

// eventually waits up to 30 s for cond to return "".
func eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	kube.Eventually(t, 30*time.Second, what, cond)
}

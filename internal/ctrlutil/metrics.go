package ctrlutil

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

var reconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "skein_reconcile_errors_total",
	Help: "Reconciles of skein's controllers that returned an error.",
}, []string{"controller"})

func init() { metrics.Registry.MustRegister(reconcileErrors) }

// CountErrors wraps r so that its errors count in
// skein_reconcile_errors_total{controller=name}.
func CountErrors(name string, r reconcile.Reconciler) reconcile.Reconciler {
	c := reconcileErrors.WithLabelValues(name)
	return reconcile.Func(func(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
		res, err := r.Reconcile(ctx, req)
		if err != nil {
			c.Inc()
		}
		return res, err
	})
}

// ReconcileErrors is the error counter of one controller (for a
// reconciler that counts errors of its own, outside Reconcile).
func ReconcileErrors(name string) prometheus.Counter { return reconcileErrors.WithLabelValues(name) }

package controller

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The controller's own metrics, served with controller-runtime's (work
// queue, reconcile totals and errors, client requests) on the manager's
// metrics endpoint.
var (
	poolBlocksAllocated = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "skein_pool_blocks_allocated",
		Help: "AddressBlocks of the pool, claimed by nodes (in use or being freed).",
	}, []string{"pool"})
	poolBlocksTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "skein_pool_blocks_total",
		Help: "Blocks the pool can hold.",
	}, []string{"pool"})
	reconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "skein_reconcile_errors_total",
		Help: "Reconciles of skein's controllers that returned an error.",
	}, []string{"controller"})
	gcDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "skein_gc_deleted_total",
		Help: "Objects removed by the node garbage collector, by kind (AddressBlock, BlockRequest, Lease).",
	}, []string{"kind"})
	gcDeferred = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "skein_gc_deferred_total",
		Help: "Times the node garbage collector found a deleted Node whose node still looks alive (its Lease, or its newest block, younger than the grace period) and kept its blocks.",
	})
	poolStatusWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "skein_pool_status_writes_total",
		Help: "AddressPool status updates written (at most one per pool per --pool-status-interval).",
	})
)

func init() {
	metrics.Registry.MustRegister(poolBlocksAllocated, poolBlocksTotal, reconcileErrors, gcDeleted, gcDeferred,
		poolStatusWrites)
}

// countErrors wraps r so that its errors count in skein_reconcile_errors_total.
func countErrors(name string, r reconcile.Reconciler) reconcile.Reconciler {
	c := reconcileErrors.WithLabelValues(name)
	return reconcile.Func(func(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
		res, err := r.Reconcile(ctx, req)
		if err != nil {
			c.Inc()
		}
		return res, err
	})
}

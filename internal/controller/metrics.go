package controller

import (
	"context"
	"time"

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
		Help: "AddressBlocks carved from the pool (in use or being freed).",
	}, []string{"pool"})
	poolBlocksTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "skein_pool_blocks_total",
		Help: "Blocks the pool can hold.",
	}, []string{"pool"})
	// The start is the request's creationTimestamp, which the API server
	// keeps to the whole second: a figure here can be up to a second
	// above the truth. skeind measures the wait exactly on its side.
	blockRequestLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "skein_blockrequest_latency_seconds",
		Help:    "From a BlockRequest's creation (whole seconds) to its Complete condition.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60},
	})
	blockRequestsAnswered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "skein_blockrequests_total",
		Help: "BlockRequests answered, by result (Complete, or the reason of Failed).",
	}, []string{"result"})
	reconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "skein_reconcile_errors_total",
		Help: "Reconciles of skein's controllers that returned an error.",
	}, []string{"controller"})
	collisions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "skein_blockrequest_index_collisions_total",
		Help: "Block indices chosen that turned out to be another request's block (the cache was behind).",
	})
	gcDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "skein_gc_deleted_total",
		Help: "Objects of deleted nodes removed by the controller, by kind.",
	}, []string{"kind"})
)

func init() {
	metrics.Registry.MustRegister(poolBlocksAllocated, poolBlocksTotal, blockRequestLatency,
		blockRequestsAnswered, reconcileErrors, collisions, gcDeleted)
}

// observeAnswer records a request answered now.
func observeAnswer(result string, created time.Time) {
	blockRequestsAnswered.WithLabelValues(result).Inc()
	if result == resultComplete && !created.IsZero() {
		blockRequestLatency.Observe(time.Since(created).Seconds())
	}
}

const resultComplete = "Complete"

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

package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
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
	metrics.Registry.MustRegister(poolBlocksAllocated, poolBlocksTotal, gcDeleted, gcDeferred,
		poolStatusWrites)
}

package kubestore

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

type storeMetrics struct {
	reads, writes atomic.Uint64
	requests      *prometheus.CounterVec
	claim         *prometheus.HistogramVec
	conflicts     prometheus.Counter
	lost          *prometheus.CounterVec
	liveReads     prometheus.Counter
	leaseErrors   prometheus.Counter
}

func newStoreMetrics() *storeMetrics {
	return &storeMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skein_api_requests_total",
			Help: "Requests skeind made to the Kubernetes API server, by HTTP method (GET includes lists and watches).",
		}, []string{"method"}),
		claim: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "skein_block_claim_seconds",
			Help:    "Time of one block claim (the create of an AddressBlock, and the pool read after it), by pool and result (ok, taken, timeout, failed).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"pool", "result"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "skein_block_claim_conflicts_total",
			Help: "Block claims refused because another node held the index first (the claim then tries another index).",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skein_blocks_lost_total",
			Help: "Blocks this node allocated from that stopped being its own behind its back (deleted, or given to another node), by pool.",
		}, []string{"pool"}),
		liveReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "skein_namespace_live_reads_total",
			Help: "Namespaces read from the API server because the cache had not seen them yet (to find their pool).",
		}),
		leaseErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "skein_node_lease_errors_total",
			Help: "Failed renewals of this node's liveness Lease.",
		}),
	}
}

func (m *storeMetrics) observeClaim(pool string, took time.Duration, err error) {
	result := "ok"
	switch {
	case errors.Is(err, store.ErrConflict):
		result = "taken"
	case errors.Is(err, ipam.ErrTryAgain):
		result = "timeout"
	case err != nil:
		result = "failed"
	}
	m.claim.WithLabelValues(pool, result).Observe(took.Seconds())
}

// countRequests wraps the client's transport: every request to the API
// server is counted.
func (m *storeMetrics) countRequests(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			m.reads.Add(1)
		} else {
			m.writes.Add(1)
		}
		m.requests.WithLabelValues(r.Method).Inc()
		return rt.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Collectors are the Store's metrics, for skeind's registry.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.m.requests, s.m.claim, s.m.conflicts, s.m.lost, s.m.liveReads, s.m.leaseErrors}
}

package kubestore

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/skeinnet/skein/internal/ipam"
)

type storeMetrics struct {
	reads, writes atomic.Uint64
	requests      *prometheus.CounterVec
	grant         *prometheus.HistogramVec
}

func newStoreMetrics() *storeMetrics {
	return &storeMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skein_api_requests_total",
			Help: "Requests skeind made to the Kubernetes API server, by HTTP method (GET includes lists and watches).",
		}, []string{"method"}),
		grant: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "skein_block_wait_seconds",
			Help:    "Time from creating a BlockRequest to holding its block, by pool and result (ok, timeout, failed).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"pool", "result"}),
	}
}

func (m *storeMetrics) observeGrant(pool string, took time.Duration, err error) {
	result := "ok"
	switch {
	case errors.Is(err, ipam.ErrTryAgain):
		result = "timeout"
	case err != nil:
		result = "failed"
	}
	m.grant.WithLabelValues(pool, result).Observe(took.Seconds())
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
	return []prometheus.Collector{s.m.requests, s.m.grant}
}

package daemon

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skein_requests_total",
			Help: "Requests served, by front door, verb and result code (0 = success).",
		}, []string{"frontdoor", "verb", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "skein_request_duration_seconds",
			Help:    "Time skeind spent on a request, by front door and verb.",
			Buckets: []float64{.0005, .001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1, 2, 5},
		}, []string{"frontdoor", "verb"}),
	}
	// Counted from the store at scrape time, so that every front door's
	// attachments (Docker's endpoints are written by the Docker front
	// door, not through Attach) are counted, and a restart needs no
	// bookkeeping.
	attachments := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "skein_attachments",
		Help: "Attachments this node holds: interfaces with a host link (CNI, VM and Docker endpoints; Docker's address leases are not counted).",
	}, func() float64 { return float64(d.countAttachments()) })
	m.reg.MustRegister(m.requests, m.duration, attachments, &poolCollector{d: d},
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// storeCollectors is a store with metrics of its own (the Kubernetes
// store's API requests and block waits).
type storeCollectors interface {
	Collectors() []prometheus.Collector
}

// registerStore adds the metrics of st (the store, the routing loop), if
// it has any.
func (m *metrics) registerStore(st any) {
	if sc, ok := st.(storeCollectors); ok {
		m.reg.MustRegister(sc.Collectors()...)
	}
}

func (m *metrics) observe(frontdoor, verb string, code uint, d time.Duration) {
	m.requests.WithLabelValues(frontdoor, verb, strconv.FormatUint(uint64(code), 10)).Inc()
	m.duration.WithLabelValues(frontdoor, verb).Observe(d.Seconds())
}

func (m *metrics) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	ok := func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/readyz", ok)
	return mux
}

// poolCollector reports per-pool use at scrape time.
type poolCollector struct{ d *Daemon }

var (
	poolUsedDesc   = prometheus.NewDesc("skein_pool_used_addresses", "Addresses held in the pool on this node.", []string{"pool"}, nil)
	poolFreeDesc   = prometheus.NewDesc("skein_pool_free_addresses", "Free addresses in blocks this node owns.", []string{"pool"}, nil)
	poolBlocksDesc = prometheus.NewDesc("skein_pool_blocks", "Blocks of the pool this node owns.", []string{"pool"}, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolUsedDesc
	ch <- poolFreeDesc
	ch <- poolBlocksDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx := context.Background()
	pools, err := c.d.st.ListPools(ctx)
	if err != nil {
		return
	}
	for _, p := range pools {
		u, err := c.d.ipam.Usage(ctx, p.Name)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(poolUsedDesc, prometheus.GaugeValue, float64(u.Used), p.Name)
		ch <- prometheus.MustNewConstMetric(poolFreeDesc, prometheus.GaugeValue, float64(u.Free), p.Name)
		ch <- prometheus.MustNewConstMetric(poolBlocksDesc, prometheus.GaugeValue, float64(u.Blocks), p.Name)
	}
}

// countAttachments counts the records that have a host link.
func (d *Daemon) countAttachments() int {
	atts, err := d.st.ListAttachments(context.Background())
	if err != nil {
		d.log.Warn("metrics: count attachments", "err", err)
		return 0
	}
	n := 0
	for _, a := range atts {
		if a.HostLink != "" {
			n++
		}
	}
	return n
}

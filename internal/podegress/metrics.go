package podegress

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the Client, served with skeind's (Collectors).
type metrics struct {
	apply *prometheus.HistogramVec
	pods  prometheus.GaugeFunc
	syncs prometheus.Counter
}

func newMetrics(c *Client) *metrics {
	return &metrics{
		apply: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "skein_egress_apply_seconds",
			Help: "Time the egress data plane took to converge a pod's tunnels (on ADD, on a change, on DEL), by result (ok, error).",
			// The goal for the tunnels' part of an ADD is 2 ms.
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .1, .5},
		}, []string{"result"}),
		pods: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "skein_egress_pods",
			Help: "Pods of this node with egress tunnels applied.",
		}, func() float64 { return float64(c.podsWithGateways()) }),
		syncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "skein_egress_pod_syncs_total",
			Help: "Times a followed pod was converged again after a change of it, of an Egress or Service it names, or of the AddressPools' subnets (most find nothing to apply).",
		}),
	}
}

func (m *metrics) observe(took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.apply.WithLabelValues(result).Observe(took.Seconds())
}

// Collectors are the Client's metrics, for skeind's registry.
func (c *Client) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.m.apply, c.m.pods, c.m.syncs}
}

// podsWithGateways counts the pods whose applied configuration has a
// gateway.
func (c *Client) podsWithGateways() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, st := range c.pods {
		if st.gateways > 0 {
			n++
		}
	}
	return n
}

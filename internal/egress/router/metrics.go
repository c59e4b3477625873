package router

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	reg        *prometheus.Registry
	syncErrors prometheus.Counter
}

var (
	clientsDesc   = prometheus.NewDesc("skein_egress_clients", "Client pods of this router's Egress that have addresses.", nil, nil)
	tunnelsDesc   = prometheus.NewDesc("skein_egress_tunnels", "Tunnel devices to client pods in the router.", nil, nil)
	peersDesc     = prometheus.NewDesc("skein_egress_peers", "Client addresses the data plane was last synced with.", nil, nil)
	conntrackDesc = prometheus.NewDesc("skein_egress_conntrack_entries", "Connections the router's kernel tracks (NAT state).", nil, nil)
	packetsDesc   = prometheus.NewDesc("skein_egress_packets_total", "Packets the router forwarded between its tunnels and the outside, both ways (its nftables counters).", nil, nil)
	bytesDesc     = prometheus.NewDesc("skein_egress_bytes_total", "Bytes the router forwarded between its tunnels and the outside, both ways (its nftables counters).", nil, nil)
	natDesc       = prometheus.NewDesc("skein_egress_nat_connections_total", "Connections the router masqueraded.", nil, nil)
	droppedDesc   = prometheus.NewDesc("skein_egress_dropped_packets_total", "Packets out of the tunnels the router dropped: reason source (not the tunnel's client's address) or destination (not one of the Egress's).", []string{"reason"}, nil)
)

func newMetrics(a *Agent) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "skein_egress_sync_errors_total",
			Help: "Syncs of the peer set the data plane refused (each retried with backoff).",
		}),
	}
	m.reg.MustRegister(m.syncErrors, &collector{a: a},
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// collector reads the peer set and the data plane's Stats at scrape time.
type collector struct{ a *Agent }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{clientsDesc, tunnelsDesc, peersDesc, conntrackDesc, packetsDesc, bytesDesc, natDesc, droppedDesc} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.a.dpMu.Lock()
	serves := c.a.serves
	dp := c.a.dp
	c.a.dpMu.Unlock()
	if serves == nil {
		serves = func(ns string) bool { return ns == c.a.o.Namespace }
	}
	_, pods := c.a.peers.snapshot(serves)
	ch <- prometheus.MustNewConstMetric(clientsDesc, prometheus.GaugeValue, float64(pods))
	c.a.dpMu.Lock()
	dp = c.a.dp
	var st Stats
	var err error
	if dp != nil {
		st, err = dp.Stats()
	}
	c.a.dpMu.Unlock()
	switch {
	case dp == nil:
		return // not open yet: no figures rather than zeros
	case err != nil:
		ch <- prometheus.NewInvalidMetric(tunnelsDesc, fmt.Errorf("data plane stats: %w", err))
		return
	}
	ch <- prometheus.MustNewConstMetric(tunnelsDesc, prometheus.GaugeValue, float64(st.Tunnels))
	ch <- prometheus.MustNewConstMetric(peersDesc, prometheus.GaugeValue, float64(st.Peers))
	ch <- prometheus.MustNewConstMetric(conntrackDesc, prometheus.GaugeValue, float64(st.ConntrackEntries))
	ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(st.Packets))
	ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(natDesc, prometheus.CounterValue, float64(st.NATConnections))
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(st.DroppedSource), "source")
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(st.DroppedDestination), "destination")
}

// Handler serves /metrics, /healthz (the process answers) and /readyz
// (the data plane has been synced once; until then 503 with the reason).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if a.Ready() {
			fmt.Fprintln(w, "ok")
			return
		}
		msg := "not synced yet"
		if p := a.problem.Load(); p != nil {
			msg = *p
		}
		http.Error(w, "not ready: "+msg, http.StatusServiceUnavailable)
	})
	return mux
}

package kubescale

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/kube"
)

// node is one simulated skeind: its own API connection, credentials
// (skeind's ServiceAccount, a token bound to a Pod on the node) and rate
// limiter, a kubestore.Store over the shared informer cache, and an
// ipam.Manager over it, exactly as skeind wires them.
type node struct {
	name  string
	st    *timedStore
	m     *ipam.Manager
	meter *meter
	hc    *http.Client // the node's own connection, for its watches
	lost  atomic.Int64 // blocks the Manager reported lost
	// watchEvents counts the events its watches received.
	watchEvents atomic.Int64

	addrMu sync.Mutex
	addrs  []netip.Addr // every address handed to this node's pods
}

func (n *node) took(a []netip.Addr) {
	n.addrMu.Lock()
	n.addrs = append(n.addrs, a...)
	n.addrMu.Unlock()
}

// nodeOptions are what every node is started with.
type nodeOptions struct {
	env          *kube.Env
	shared       cache.Cache
	claimTimeout time.Duration
	leases       bool
	rec          *recorder
	lat          *latencies
	// dispatch, if set, hands each Store only the block events of its
	// node (dispatch_test.go); nil: every Store's handlers see every event.
	dispatch *dispatcher
	// level is the UID of skeind's priority level (skeind-flowcontrol.yaml),
	// "" when it is not applied.
	level string
}

func startNode(ctx context.Context, o nodeOptions, name, token, dbPath string) (_ *node, err error) {
	n := &node{name: name, meter: &meter{level: o.level, lat: o.lat}}
	rt, err := ownTransport(o.env.Config.CAData)
	if err != nil {
		return nil, err
	}
	// Its own connection (a real node has one: client-go would otherwise
	// share one HTTP/2 connection among all the simulated nodes, and its
	// stream limit would queue their requests in this process), its own
	// token, and client-go's default QPS and burst (zero here), as skeind.
	cfg := &rest.Config{Host: o.env.URL, BearerToken: token, Transport: rt, UserAgent: "skeind/kubescale (" + name + ")"}
	cfg.Wrap(n.meter.wrap)
	if n.hc, err = rest.HTTPClientFor(cfg); err != nil {
		return nil, err
	}
	local, err := store.OpenBolt(dbPath, store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		return nil, err
	}
	leaseDuration := time.Duration(0) // skeind's default: 40 s, renewed every 10 s
	if !o.leases {
		leaseDuration = -1
	}
	var shared cache.Cache = o.shared
	if o.dispatch != nil {
		shared = &nodeCache{Cache: o.shared, node: name, d: o.dispatch}
	}
	st, err := kubestore.New(ctx, kubestore.Options{Config: cfg, Node: name, Local: local, Cache: shared,
		GrantTimeout: o.claimTimeout, LeaseDuration: leaseDuration})
	if err != nil {
		local.Close()
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	n.st = &timedStore{Store: st, rec: o.rec, node: name}
	n.m, err = ipam.NewManager(ipam.Options{Store: n.st, Node: name, Logger: quiet,
		Cluster: ipam.ClusterOptions{OnBlockLost: func(string, uint32, int) { n.lost.Add(1) }}})
	if err != nil {
		st.Close()
		return nil, err
	}
	return n, nil
}

// ownTransport is a fresh HTTP/2-capable transport trusting ca.
func ownTransport(ca []byte) (http.RoundTripper, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("no certificate in the API server's CA")
	}
	return utilnet.SetTransportDefaults(&http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}), nil
}

// watch keeps a watch of path (a list URL) open as the node until ctx
// ends, reading the events and dropping them, as a reflector would: it
// resumes from the last resourceVersion it saw and backs off on failure
// (client-go's 800 ms doubling to 30 s, with jitter); only at first and
// after an ERROR event (410 Gone) does it ask for everything again. The
// API server sends every block event to every node, as to real skeinds
// (each follows every block for routing), while the benchmark decodes
// them once, in the shared cache.
func (n *node) watch(ctx context.Context, host, path string) {
	rv := "0" // everything the watch cache holds, then changes
	backoff := 800 * time.Millisecond
	for ctx.Err() == nil {
		got := false
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			host+path+"?watch=1&allowWatchBookmarks=true&resourceVersion="+rv, nil)
		if err != nil {
			return
		}
		resp, err := n.hc.Do(req)
		if err == nil {
			if resp.StatusCode == http.StatusOK {
				// One event a line.
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 64<<10), 16<<20)
				for sc.Scan() {
					line := sc.Bytes()
					n.watchEvents.Add(1)
					got = true
					if bytes.HasPrefix(line, []byte(`{"type":"ERROR"`)) {
						rv = "0"
						continue
					}
					if v, ok := resourceVersion(line); ok {
						rv = v
					}
				}
			}
			resp.Body.Close()
		}
		if got {
			backoff = 800 * time.Millisecond
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff/2 + rand.N(backoff/2)):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// resourceVersion finds the first resourceVersion in a watch event's line:
// its object's.
func resourceVersion(line []byte) (string, bool) {
	const key = `"resourceVersion":"`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return "", false
	}
	rest := line[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return "", false
	}
	return string(rest[:j]), true
}

// counter reads one of kubestore's counters (skein_block_claim_conflicts_total,
// skein_node_lease_errors_total); -1 when the Store has none of that name.
func (n *node) counter(name string) float64 {
	for _, c := range n.st.Collectors() {
		if ctr, ok := c.(prometheus.Counter); ok && strings.Contains(ctr.Desc().String(), `"`+name+`"`) {
			return testutil.ToFloat64(ctr)
		}
	}
	return -1
}

// pathCount counts the API requests made under a context: a pod ADD's
// (pathKey) or a claim's (claimKey).
type pathCount struct {
	requests, writes, creates atomic.Int64
}

type pathKey struct{}

type claimKey struct{}

// claimTime adds up the time a claim's requests spent past the client's
// rate limiter (on the wire and in the API server), and in it.
type claimTime struct{ wire, limiter atomic.Int64 }

// limiterWaits receives client-go's rate limiter waits (every client's:
// the variable is client-go's global hook, which controller-runtime does
// not set) and adds those of a claim's requests to its claimTime.
type limiterWaits struct{ all atomic.Int64 }

func (l *limiterWaits) Observe(ctx context.Context, _ string, _ url.URL, d time.Duration) {
	l.all.Add(int64(d))
	if c, ok := ctx.Value(claimKey{}).(*claimTime); ok {
		c.limiter.Add(int64(d))
	}
}

var rateLimiter = &limiterWaits{}

func init() { clientmetrics.RateLimiterLatency = rateLimiter }

func (c *pathCount) on(ctx context.Context) context.Context {
	return context.WithValue(ctx, pathKey{}, c)
}

// meter sees every request of one node at its transport.
type meter struct {
	level string     // skeind's priority level's UID, or ""
	lat   *latencies // shared by every node's meter

	requests, writes atomic.Int64
	creates          atomic.Int64 // AddressBlock creates: claims attempted
	taken            atomic.Int64 // their 409s
	rejected         atomic.Int64 // 429 responses (client-go retries them)
	claimWrites      atomic.Int64 // writes made inside claims
	otherLevel       atomic.Int64 // answers classified into another priority level than skeind's
	unclassified     atomic.Int64 // answers without a priority level header
}

func (m *meter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		start := time.Now()
		m.requests.Add(1)
		write := r.Method != http.MethodGet && r.Method != http.MethodHead
		if write {
			m.writes.Add(1)
		}
		create := r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/addressblocks")
		if create {
			m.creates.Add(1)
		}
		if c, ok := r.Context().Value(pathKey{}).(*pathCount); ok {
			c.requests.Add(1)
			if write {
				c.writes.Add(1)
			}
			if create {
				c.creates.Add(1)
			}
		}
		claim, _ := r.Context().Value(claimKey{}).(*claimTime)
		if write && claim != nil {
			m.claimWrites.Add(1)
		}
		resp, err := rt.RoundTrip(r)
		if r.URL.Query().Get("watch") == "" {
			m.lat.add(requestKind(r), time.Since(start))
		}
		if claim != nil {
			claim.wire.Add(int64(time.Since(start)))
		}
		if err != nil {
			return resp, err
		}
		switch resp.StatusCode {
		case http.StatusTooManyRequests:
			m.rejected.Add(1)
		case http.StatusConflict:
			if create {
				m.taken.Add(1)
			}
		}
		// API Priority and Fairness names the level that served (or
		// refused) the request in every answer.
		switch lvl := resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID"); {
		case lvl == "":
			m.unclassified.Add(1)
		case m.level != "" && lvl != m.level:
			m.otherLevel.Add(1)
		}
		return resp, nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// logCount is a slog handler that drops records but counts those at Warn
// and above, keeping the first: the Managers' logs (quiet) and the
// default logger's, where kubestore warns (a Lease it could not renew).
type logCount struct {
	n     atomic.Int64
	first atomic.Value // string
}

var (
	managerLogs, defaultLogs logCount
	quiet                    = slog.New(countingHandler{&managerLogs})
)

func (c *logCount) String() string {
	first, _ := c.first.Load().(string)
	return fmt.Sprintf("%d, the first: %s", c.n.Load(), first)
}

type countingHandler struct{ c *logCount }

func (countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.c.n.Add(1)
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.c.first.CompareAndSwap(nil, b.String())
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// requestKind names a request for the latency table: what skeind asks
// the API server.
func requestKind(r *http.Request) string {
	p := r.URL.Path
	res := p[strings.LastIndexByte(p, '/')+1:]
	switch {
	case strings.Contains(p, "/addressblocks"):
		res = "addressblocks"
	case strings.Contains(p, "/addresspools"):
		res = "addresspools"
	case strings.Contains(p, "/leases"):
		res = "leases"
	case strings.Contains(p, "/nodes"):
		res = "nodes"
	case strings.HasPrefix(p, "/api"):
		res = "discovery"
	}
	return r.Method + " " + res
}

// latencies gathers request latencies (at the transport: after client-go's
// rate limiter, so the time in the API server and on the wire) by kind.
type latencies struct {
	mu sync.Mutex
	by map[string][]time.Duration
}

func (l *latencies) add(kind string, d time.Duration) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.by == nil {
		l.by = map[string][]time.Duration{}
	}
	l.by[kind] = append(l.by[kind], d)
	l.mu.Unlock()
}

package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Syncer makes the kernel route the remote blocks (*Kernel in production;
// a fake in unit tests). Sync is declarative and safe to repeat; nil
// remotes means none. It returns one Status per remote, also alongside an
// error when it got that far (the Loop keeps the previous statuses when it
// returns none).
type Syncer interface {
	Sync(ctx context.Context, remotes []Remote) ([]Status, error)
}

// LocalSetter is a Syncer whose idea of this node's own addresses can
// change (*Kernel: SetLocalAddrs); see LoopOptions.SelfNode.
type LocalSetter interface {
	SetLocalAddrs(addrs []netip.Addr) error
}

// Source is the cluster's routing view (*Watcher in production).
// Snapshot reads memory; Changed receives after a change (coalesced).
type Source interface {
	Snapshot(ctx context.Context) (Snapshot, error)
	Changed() <-chan struct{}
}

// Eventer reports a problem with a remote node on its Node object (a
// Kubernetes Warning event). It must not block.
type Eventer interface {
	NodeWarning(node NodeInfo, reason, message string)
}

// Event reasons the Loop reports.
const (
	// ReasonNodeUnreachable: some of a node's blocks have no route.
	ReasonNodeUnreachable = "NodeUnreachable"
	// ReasonInvalidNodeAddress: a node's skein.dev/node-address
	// annotation is invalid; its InternalIPs are used.
	ReasonInvalidNodeAddress = "InvalidNodeAddress"
)

// LoopOptions configures NewLoop. Source and Syncer are required.
type LoopOptions struct {
	// Mode is reported by Mode (ListRoutes); it decides nothing here.
	Mode   Mode
	Source Source
	Syncer Syncer
	// Events, if set, gets a Warning when a node's blocks cannot be
	// routed or its address annotation is invalid. In export mode no
	// event is sent for missing routes: they are the routing daemon's to
	// install, and missing while BGP converges (logs and metrics still
	// say so).
	Events Eventer
	// Logger; nil = slog.Default().
	Logger *slog.Logger
	// Resync: a sync runs this long after the last one even without a
	// change, to repair drift in the kernel; 0 = 30 s.
	Resync time.Duration
	// Coalesce: after a change, wait this long for more before syncing;
	// 0 = 10 ms.
	Coalesce time.Duration
	// MinBackoff and MaxBackoff bound the wait before retrying a failed
	// sync (doubling from MinBackoff); 0 = 100 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// SyncTimeout bounds one sync; 0 = 1 minute.
	SyncTimeout time.Duration
	// EventInterval: at most one NodeUnreachable event per remote node in
	// this time (a split cluster would send nodes² events as nodes flap);
	// logs and metrics still follow every change. 0 = 1 hour.
	EventInterval time.Duration
	// SelfNode, if set, is this node's name: before each sync its
	// addresses in the snapshot (annotation, else InternalIPs) are given
	// to the Syncer if it is a LocalSetter, so a change of this node's
	// address moves its own tunnel end as peers move to it. Empty (skeind
	// --node-address fixed them) = never.
	SelfNode string
}

// Loop keeps the kernel's remote routes equal to the cluster's blocks: it
// syncs on every change (coalesced), every Resync, and after failures with
// a backoff; it keeps the last statuses for ListRoutes and reports each
// remote node's state once per change (log, event, metrics).
type Loop struct {
	o   LoopOptions
	log *slog.Logger
	m   *loopMetrics

	mu       sync.Mutex
	statuses []Status
	synced   bool

	// syncMu makes syncs one at a time: Run's and SyncNow's (ListRoutes
	// calls it in export mode). It guards the report state below.
	syncMu    sync.Mutex
	nodeState map[string]string    // node → "" when routed, else why not
	addrState map[string]string    // node → its annotation problem
	lastEvent map[string]time.Time // node → its last NodeUnreachable event
	local     []netip.Addr         // last addresses given to the LocalSetter
	localErr  string               // last refusal of them, logged once
}

// NewLoop returns a loop; Run runs it.
func NewLoop(o LoopOptions) (*Loop, error) {
	if o.Source == nil || o.Syncer == nil {
		return nil, errors.New("routing loop: Source and Syncer are required")
	}
	if o.Mode == "" {
		o.Mode = ModeExport
	}
	o.Resync = cmp0(o.Resync, 30*time.Second)
	o.Coalesce = cmp0(o.Coalesce, 10*time.Millisecond)
	o.MinBackoff = cmp0(o.MinBackoff, 100*time.Millisecond)
	o.MaxBackoff = cmp0(o.MaxBackoff, 30*time.Second)
	o.SyncTimeout = cmp0(o.SyncTimeout, time.Minute)
	o.EventInterval = cmp0(o.EventInterval, time.Hour)
	return &Loop{o: o, log: logger(o.Logger), m: newLoopMetrics(), nodeState: map[string]string{}, addrState: map[string]string{},
		lastEvent: map[string]time.Time{}}, nil
}

func cmp0(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Mode is the routing mode the loop serves.
func (l *Loop) Mode() Mode { return l.o.Mode }

// Statuses returns the last sync's statuses, sorted by block (a copy);
// synced is false until a sync has returned statuses.
func (l *Loop) Statuses() (st []Status, synced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.statuses), l.synced
}

// Run syncs until ctx ends; it returns ctx's error.
func (l *Loop) Run(ctx context.Context) error {
	timer := time.NewTimer(0) // the first sync: at once
	defer timer.Stop()
	due := time.Now()
	var backoff time.Duration
	var notBefore time.Time
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.o.Source.Changed():
			d := time.Now().Add(l.o.Coalesce)
			if d.Before(notBefore) {
				d = notBefore
			}
			if d.Before(due) {
				due = d
				timer.Reset(time.Until(due))
			}
		case <-timer.C:
			// Changes until now are in the snapshot about to be read.
			select {
			case <-l.o.Source.Changed():
			default:
			}
			if err := l.syncOnce(ctx); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				backoff = min(max(2*backoff, l.o.MinBackoff), l.o.MaxBackoff)
				l.log.Error("sync remote routes; retrying", "err", err, "in", backoff)
				notBefore = time.Now().Add(backoff)
				due = notBefore
			} else {
				backoff, notBefore = 0, time.Time{}
				due = time.Now().Add(l.o.Resync)
			}
			timer.Reset(time.Until(due))
		}
	}
}

// SyncNow runs one sync at once, outside Run's schedule (tests, start-up).
func (l *Loop) SyncNow(ctx context.Context) error { return l.syncOnce(ctx) }

func (l *Loop) syncOnce(ctx context.Context) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, l.o.SyncTimeout)
	defer cancel()
	start := time.Now()
	snap, err := l.o.Source.Snapshot(ctx)
	if err != nil {
		l.m.observe(time.Since(start), err)
		return fmt.Errorf("read the cluster's blocks: %w", err)
	}
	l.followSelf(snap)
	st, err := l.o.Syncer.Sync(ctx, snap.Remotes)
	l.m.observe(time.Since(start), err)
	if st != nil || err == nil {
		slices.SortFunc(st, func(a, b Status) int { return a.Block.Addr().Compare(b.Block.Addr()) })
		l.mu.Lock()
		l.statuses, l.synced = st, true
		l.mu.Unlock()
		l.report(snap, st)
	}
	if err != nil {
		return fmt.Errorf("sync %d remote blocks: %w", len(snap.Remotes), err)
	}
	return nil
}

// followSelf gives the Syncer this node's addresses from snap when they
// changed (SelfNode). A Node without addresses changes nothing; addresses
// the Syncer refuses are logged (once) and the previous ones stay.
func (l *Loop) followSelf(snap Snapshot) {
	ls, ok := l.o.Syncer.(LocalSetter)
	if l.o.SelfNode == "" || !ok {
		return
	}
	addrs := snap.Nodes[l.o.SelfNode].Addrs
	if len(addrs) == 0 || slices.Equal(addrs, l.local) {
		return
	}
	if err := ls.SetLocalAddrs(addrs); err != nil {
		if msg := err.Error(); msg != l.localErr {
			l.localErr = msg
			l.log.Error("routing: this node's new addresses refused; keeping the previous ones", "addrs", addrs, "err", err)
		}
		return
	}
	if l.local != nil {
		l.log.Info("routing: this node's addresses changed", "from", l.local, "to", addrs)
	}
	l.local, l.localErr = slices.Clone(addrs), ""
}

// eventDue reports whether node may get a NodeUnreachable event now (none
// in the last EventInterval), and if so counts it as sent.
func (l *Loop) eventDue(node string) bool {
	now := time.Now()
	if last, ok := l.lastEvent[node]; ok && now.Sub(last) < l.o.EventInterval {
		return false
	}
	l.lastEvent[node] = now
	return true
}

// report logs, events and counts each remote node's state, once per
// change of it.
func (l *Loop) report(snap Snapshot, st []Status) {
	type nodeRoutes struct {
		total, missing int
		reasons        []string
	}
	per := map[string]*nodeRoutes{}
	installed, missing := 0, 0
	for _, s := range st {
		n := per[s.Node]
		if n == nil {
			n = &nodeRoutes{}
			per[s.Node] = n
		}
		n.total++
		if s.Installed {
			installed++
			continue
		}
		missing++
		n.missing++
		r := s.Reason
		if r == "" {
			r = "not installed"
		}
		if !slices.Contains(n.reasons, r) {
			n.reasons = append(n.reasons, r)
		}
	}
	unreachable := 0
	for name, n := range per {
		state := ""
		if n.missing > 0 {
			unreachable++
			slices.Sort(n.reasons)
			state = strings.Join(n.reasons, "; ")
		}
		old, known := l.nodeState[name]
		l.nodeState[name] = state
		if known && old == state {
			continue
		}
		node := snap.Nodes[name]
		node.Name = name
		switch {
		case state != "":
			l.log.Warn("remote node's blocks not routed", "node", name, "mode", l.o.Mode, "blocks", n.total, "unrouted", n.missing, "reason", state)
			// No event for a node without a Node object (deleted; its
			// blocks wait for the controller's collection): nothing to
			// put it on.
			if l.o.Events != nil && l.o.Mode != ModeExport && node.UID != "" && l.eventDue(name) {
				l.o.Events.NodeWarning(node, ReasonNodeUnreachable,
					fmt.Sprintf("%d of %d blocks of node %s have no %s route from this node: %s", n.missing, n.total, name, l.o.Mode, state))
			}
		case known:
			l.log.Info("remote node's blocks routed again", "node", name, "mode", l.o.Mode, "blocks", n.total)
		default:
			l.log.Debug("remote node's blocks routed", "node", name, "mode", l.o.Mode, "blocks", n.total)
		}
	}
	for name, old := range l.nodeState {
		if _, ok := per[name]; !ok {
			delete(l.nodeState, name)
			delete(l.lastEvent, name)
			if old != "" {
				l.log.Info("remote node has no blocks any more", "node", name)
			}
		}
	}
	for name, n := range snap.Nodes {
		prob := ""
		if n.BadAnnotation != nil {
			prob = n.BadAnnotation.Error()
		}
		if l.addrState[name] == prob {
			continue
		}
		if prob == "" {
			delete(l.addrState, name)
			l.log.Info("node address annotation fixed", "node", name, "addresses", n.Addrs)
			continue
		}
		l.addrState[name] = prob
		l.log.Warn("node address annotation invalid; using its InternalIPs", "node", name, "err", prob, "addresses", n.Addrs)
		if l.o.Events != nil {
			l.o.Events.NodeWarning(n, ReasonInvalidNodeAddress, prob+"; routing uses the node's InternalIPs")
		}
	}
	for name := range l.addrState {
		if _, ok := snap.Nodes[name]; !ok {
			delete(l.addrState, name)
		}
	}
	l.m.set(installed, missing, unreachable)
}

// Collectors are the loop's metrics, for skeind's registry.
func (l *Loop) Collectors() []prometheus.Collector { return l.m.collectors() }

type loopMetrics struct {
	blocks      *prometheus.GaugeVec
	unreachable prometheus.Gauge
	seconds     prometheus.Histogram
	syncs       *prometheus.CounterVec
}

func newLoopMetrics() *loopMetrics {
	m := &loopMetrics{
		blocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "skein_route_remote_blocks",
			Help: "Other nodes' block slices (one per address family) at the last sync, by state: installed (routed) or missing.",
		}, []string{"state"}),
		unreachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "skein_route_unreachable_nodes",
			Help: "Remote nodes with at least one block this node has no route to, at the last sync.",
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "skein_route_sync_seconds",
			Help:    "Time of one sync of the remote routes (reading the cache and programming the kernel).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skein_route_syncs_total",
			Help: "Syncs of the remote routes, by result (ok or error).",
		}, []string{"result"}),
	}
	m.blocks.WithLabelValues("installed")
	m.blocks.WithLabelValues("missing")
	m.syncs.WithLabelValues("ok")
	m.syncs.WithLabelValues("error")
	return m
}

func (m *loopMetrics) observe(took time.Duration, err error) {
	m.seconds.Observe(took.Seconds())
	if err != nil {
		m.syncs.WithLabelValues("error").Inc()
	} else {
		m.syncs.WithLabelValues("ok").Inc()
	}
}

func (m *loopMetrics) set(installed, missing, unreachable int) {
	m.blocks.WithLabelValues("installed").Set(float64(installed))
	m.blocks.WithLabelValues("missing").Set(float64(missing))
	m.unreachable.Set(float64(unreachable))
}

func (m *loopMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.blocks, m.unreachable, m.seconds, m.syncs}
}

package routing

import (
	"cmp"
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

// Updater is a Syncer that can also apply a change of some blocks alone
// (*Kernel: Update): afterwards the kernel holds for each prefix in blocks
// what Sync would for remotes, the remotes claiming it (none: gone), and
// everything else as it was. It returns one Status per remote, or
// ErrFullSync when only a Sync can do it.
type Updater interface {
	Update(ctx context.Context, blocks []netip.Prefix, remotes []Remote) ([]Status, error)
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
	// Resync: a full sync runs this long after the last one whatever
	// changed, to repair drift in the kernel; 0 = 30 s. In between, a
	// Syncer that is an Updater gets only the blocks that changed.
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
//
// The sync at start, every Resync and after a failure is full (Sync of
// every remote). A change in between, with an Updater, is applied alone:
// the Loop compares the snapshot with the one it last applied and hands
// Update the blocks whose claimants differ (a block added, deleted or
// moved, every block of a node whose address changed). At 3,000 blocks
// that is a few netlink messages instead of dumping and comparing the
// whole table (see BenchmarkChange3000Blocks).
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
	// applied is the remotes the kernel holds (the last snapshot synced
	// or updated), sorted by remoteOrder; known false = unknown, the next
	// sync is full.
	applied []Remote
	known   bool
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
	timer := time.NewTimer(0) // the first sync: at once, full
	defer timer.Stop()
	due := time.Now() // the next sync
	fullDue := due    // the next full sync
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
			full := !time.Now().Before(fullDue)
			if err := l.syncOnce(ctx, full); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				backoff = min(max(2*backoff, l.o.MinBackoff), l.o.MaxBackoff)
				l.log.Error("sync remote routes; retrying", "err", err, "in", backoff)
				notBefore = time.Now().Add(backoff)
				due, fullDue = notBefore, notBefore
			} else {
				backoff, notBefore = 0, time.Time{}
				if full {
					fullDue = time.Now().Add(l.o.Resync)
				}
				due = fullDue
			}
			timer.Reset(time.Until(due))
		}
	}
}

// SyncNow runs one full sync at once, outside Run's schedule (tests,
// start-up, ListRoutes in export mode).
func (l *Loop) SyncNow(ctx context.Context) error { return l.syncOnce(ctx, true) }

// SyncChanges runs one sync as Run does after a change: only the blocks
// whose claimants changed since the last sync when the Syncer is an
// Updater and the last sync went well, else a full one.
func (l *Loop) SyncChanges(ctx context.Context) error { return l.syncOnce(ctx, false) }

// syncOnce reads a snapshot and applies it: everything (full, or when the
// Syncer is no Updater or the last sync failed), else only the blocks
// whose claimants changed since the last sync.
func (l *Loop) syncOnce(ctx context.Context, full bool) error {
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
	if l.followSelf(snap) {
		full = true // vxlan: the device moves to the new address
	}
	// Sorted (a Watcher's are already), so that a block's claimants come
	// in the same order to Sync and Update and two lists compare in one
	// pass.
	if !slices.IsSortedFunc(snap.Remotes, remoteOrder) {
		snap.Remotes = slices.Clone(snap.Remotes)
		slices.SortFunc(snap.Remotes, remoteOrder)
	}
	if up, ok := l.o.Syncer.(Updater); ok && !full && l.known {
		err := l.update(ctx, up, snap, start)
		if !errors.Is(err, ErrFullSync) {
			return err
		}
	}
	l.known = false
	st, err := l.o.Syncer.Sync(ctx, snap.Remotes)
	l.m.observe(time.Since(start), err)
	l.m.kind("full")
	if st != nil || err == nil {
		st = slices.Clone(st)
		slices.SortFunc(st, statusOrder)
		l.setStatuses(st)
		l.report(snap, st)
	}
	if err != nil {
		return fmt.Errorf("sync %d remote blocks: %w", len(snap.Remotes), err)
	}
	l.applied, l.known = snap.Remotes, true
	return nil
}

// update applies the blocks whose claimants differ between l.applied and
// snap; ErrFullSync when the Updater cannot.
func (l *Loop) update(ctx context.Context, up Updater, snap Snapshot, start time.Time) error {
	blocks, remotes := changedBlocks(l.applied, snap.Remotes)
	if len(blocks) == 0 {
		// Nothing the routes depend on (a node's bad annotation may
		// have, which the report follows).
		st, _ := l.Statuses()
		l.report(snap, st)
		return nil
	}
	got, err := up.Update(ctx, blocks, remotes)
	if errors.Is(err, ErrFullSync) {
		return err
	}
	l.m.observe(time.Since(start), err)
	l.m.kind("incremental")
	if err != nil {
		l.known = false // the next sync is full
		return fmt.Errorf("update %d remote blocks: %w", len(blocks), err)
	}
	got = slices.Clone(got)
	slices.SortFunc(got, statusOrder)
	l.mu.Lock()
	old := l.statuses
	l.mu.Unlock()
	st := mergeStatuses(old, got, blocks)
	l.setStatuses(st)
	l.report(snap, st)
	l.applied = snap.Remotes
	return nil
}

func (l *Loop) setStatuses(st []Status) {
	l.mu.Lock()
	l.statuses, l.synced = st, true
	l.mu.Unlock()
}

// remoteOrder sorts by block, then name.
func remoteOrder(a, b Remote) int {
	return cmp.Or(a.Block.Addr().Compare(b.Block.Addr()), cmp.Compare(a.Block.Bits(), b.Block.Bits()), strings.Compare(a.Name, b.Name))
}

func statusOrder(a, b Status) int { return remoteOrder(a.Remote, b.Remote) }

func blockOrder(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// changedBlocks compares two lists sorted by remoteOrder in one pass: the
// blocks (in order) whose claimants differ (in name, node or addresses;
// a block in one list only among them), and the claimants of those in
// next.
func changedBlocks(old, next []Remote) (blocks []netip.Prefix, remotes []Remote) {
	i, j := 0, 0
	for i < len(old) || j < len(next) {
		var p netip.Prefix
		switch {
		case j == len(next) || i < len(old) && blockOrder(old[i].Block, next[j].Block) < 0:
			p = old[i].Block
		default:
			p = next[j].Block
		}
		ei, ej := i, j
		for ei < len(old) && old[ei].Block == p {
			ei++
		}
		for ej < len(next) && next[ej].Block == p {
			ej++
		}
		if !slices.EqualFunc(old[i:ei], next[j:ej], sameRemote) {
			blocks = append(blocks, p)
			remotes = append(remotes, next[j:ej]...)
		}
		i, j = ei, ej
	}
	return blocks, remotes
}

// sameRemote: the same claimant of a block, with the same addresses.
func sameRemote(x, y Remote) bool {
	return x.Name == y.Name && x.Node == y.Node && slices.Equal(x.NodeAddrs, y.NodeAddrs)
}

// mergeStatuses is old (sorted by statusOrder) without the statuses of
// blocks (sorted), merged with got (sorted).
func mergeStatuses(old, got []Status, blocks []netip.Prefix) []Status {
	out := make([]Status, 0, len(old)+len(got))
	b := 0
	for _, s := range old {
		for b < len(blocks) && blockOrder(blocks[b], s.Block) < 0 {
			b++
		}
		if b < len(blocks) && blocks[b] == s.Block {
			continue
		}
		for len(got) > 0 && statusOrder(got[0], s) < 0 {
			out = append(out, got[0])
			got = got[1:]
		}
		out = append(out, s)
	}
	return append(out, got...)
}

// followSelf gives the Syncer this node's addresses from snap when they
// changed (SelfNode), and says whether it did. A Node without addresses
// changes nothing; addresses the Syncer refuses are logged (once) and the
// previous ones stay.
func (l *Loop) followSelf(snap Snapshot) bool {
	ls, ok := l.o.Syncer.(LocalSetter)
	if l.o.SelfNode == "" || !ok {
		return false
	}
	addrs := snap.Nodes[l.o.SelfNode].Addrs
	if len(addrs) == 0 || slices.Equal(addrs, l.local) {
		return false
	}
	if err := ls.SetLocalAddrs(addrs); err != nil {
		if msg := err.Error(); msg != l.localErr {
			l.localErr = msg
			l.log.Error("routing: this node's new addresses refused; keeping the previous ones", "addrs", addrs, "err", err)
		}
		return false
	}
	if l.local != nil {
		l.log.Info("routing: this node's addresses changed", "from", l.local, "to", addrs)
	}
	l.local, l.localErr = slices.Clone(addrs), ""
	return true
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
	kinds       *prometheus.CounterVec
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
		kinds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "skein_route_sync_kinds_total",
			Help: "Syncs of the remote routes by kind: full (every block: at start, periodically, after a failure) or incremental (the blocks a change touched).",
		}, []string{"kind"}),
	}
	m.blocks.WithLabelValues("installed")
	m.blocks.WithLabelValues("missing")
	m.syncs.WithLabelValues("ok")
	m.syncs.WithLabelValues("error")
	m.kinds.WithLabelValues("full")
	m.kinds.WithLabelValues("incremental")
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

func (m *loopMetrics) kind(k string) { m.kinds.WithLabelValues(k).Inc() }

func (m *loopMetrics) set(installed, missing, unreachable int) {
	m.blocks.WithLabelValues("installed").Set(float64(installed))
	m.blocks.WithLabelValues("missing").Set(float64(missing))
	m.unreachable.Set(float64(unreachable))
}

func (m *loopMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.blocks, m.unreachable, m.seconds, m.syncs, m.kinds}
}

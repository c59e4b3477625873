package kurma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/keylock"
	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/internal/store"
)

// Sentinel errors callers branch on.
var (
	// ErrUnknownPod: no record of the pod (Status).
	ErrUnknownPod = errors.New("no pod networks recorded for this pod")
	// ErrBadRequest: the request is invalid (unknown network, bad name,
	// duplicate interface, ...); nothing was changed.
	ErrBadRequest = errors.New("bad pod network request")
	// ErrNoPools: a built-in skein network was asked for but the Manager
	// has no Pools.
	ErrNoPools = errors.New("no skein pools to serve built-in networks")
)

// PoolRequest asks skeind for one interface from one of its pools: a
// built-in ("type":"skein") pod network.
type PoolRequest struct {
	Network     string
	Pool        string
	ContainerID string
	NetNS       string
	IfName      string
}

// Pools is skeind's own attach path, serving built-in networks.
type Pools interface {
	// AttachPool plumbs the interface and returns its CNI result (any
	// version; it is converted). On error nothing is left.
	AttachPool(ctx context.Context, r PoolRequest) (json.RawMessage, error)
	// DetachPool removes it; nil when already gone.
	DetachPool(ctx context.Context, r PoolRequest) error
}

// Options configure a Manager. Zero values are documented per field.
type Options struct {
	// Store keeps the pod records (Meta bucket MetaKind). Required.
	Store store.Store
	// Images is the plugin image cache. Required for image networks.
	Images *image.Cache
	// Sandbox runs plugin executables. Nil: one is made from
	// SandboxOptions when the first image network is used (so a daemon
	// without image networks starts no sandbox inits), closed by Close.
	Sandbox *sandbox.Sandbox
	// SandboxOptions make the Sandbox when it is nil.
	SandboxOptions sandbox.Options
	// MaxParallel caps plugin calls running at once (all pods).
	// Default sandbox.DefaultMaxParallel.
	MaxParallel int
	// StateDir holds one writable state directory per network
	// (<StateDir>/<name>, at /var/lib/network in the plugin). Required.
	StateDir string
	// Pools serves built-in networks; nil: they fail with ErrNoPools.
	Pools Pools
	// Logger; nil = slog.Default().
	Logger *slog.Logger
	// LinkNames lists the interfaces of a network namespace (to keep
	// rendered names unique); nil = netlink.
	LinkNames func(netns string) ([]string, error)
	// CheckNetNS, when set, refuses a pod namespace Attach must not use
	// (the host's, the node's, skeind's own); its error fails the Attach
	// with ErrBadRequest before anything changes.
	CheckNetNS func(netns string) error
}

// Manager attaches pods to pod networks and detaches them. Its methods are
// safe for concurrent use: calls for one pod run one at a time, in the
// order they arrive; pods proceed in parallel.
type Manager struct {
	st       store.Store
	images   *image.Cache
	sbOpts   sandbox.Options
	parallel int
	sbOnce   sync.Once
	sbOwned  bool
	sb       *sandbox.Sandbox
	runner   *sandbox.Runner
	sbErr    error
	state    string
	pools    Pools
	log      *slog.Logger
	links    func(string) ([]string, error)
	checkNS  func(string) error
	locks    keylock.Locks
	// pruneMu orders prunes against attaches: an attach drops its own
	// hold on an image (after its record names it) under the read lock,
	// a prune lists the records and prunes under the write lock, so no
	// prune can miss a record written after its list and still see the
	// image unheld.
	pruneMu sync.RWMutex

	mu     sync.Mutex
	nets   []Network
	active map[string]*netState // by network name: running main exec etc.
	// starting holds, by network name, the first use under way (ensure);
	// closed when it is done.
	starting map[string]chan struct{}
	closed   bool // Close ran: nothing is made active any more
}

// netState is a configured image network in use: its image held and its
// main exec supervised for as long as it stays in the config unchanged.
type netState struct {
	raw     json.RawMessage
	img     image.Image
	release func()
	sv      *sandbox.Supervisor
}

// NewManager returns a Manager with no networks (see SetNetworks).
func NewManager(o Options) (*Manager, error) {
	if o.Store == nil {
		return nil, errors.New("kurma manager: no store")
	}
	if o.StateDir == "" || !filepath.IsAbs(o.StateDir) {
		return nil, fmt.Errorf("kurma manager: state directory %q: want an absolute path", o.StateDir)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.LinkNames == nil {
		o.LinkNames = linkNames
	}
	m := &Manager{
		st: o.Store, images: o.Images, sb: o.Sandbox, sbOpts: o.SandboxOptions, parallel: o.MaxParallel,
		state: o.StateDir, pools: o.Pools, log: o.Logger, links: o.LinkNames, checkNS: o.CheckNetNS, active: map[string]*netState{},
		starting: map[string]chan struct{}{},
	}
	return m, nil
}

// sandbox returns the Sandbox and the Runner over it, making them on first
// use.
func (m *Manager) sandbox() (*sandbox.Sandbox, *sandbox.Runner, error) {
	m.sbOnce.Do(func() {
		if m.sb == nil {
			m.sb, m.sbErr = sandbox.New(m.sbOpts)
			m.sbOwned = m.sbErr == nil
		}
		if m.sbErr == nil {
			m.runner = sandbox.NewRunner(m.sb, m.parallel)
		}
	})
	return m.sb, m.runner, m.sbErr
}

// SetNetworks replaces the configured networks (start-up and reload).
// Networks removed or changed stop their main exec; pods attached to them
// keep their records, and their del still runs from those.
func (m *Manager) SetNetworks(nets []Network) {
	stale := map[string]*netState{}
	m.mu.Lock()
	m.nets = append([]Network(nil), nets...)
	for name, s := range m.active {
		n, ok := Find(nets, name)
		if ok && string(n.Raw) == string(s.raw) {
			continue
		}
		stale[name] = s
		delete(m.active, name)
	}
	m.mu.Unlock()
	// Stopping a main exec takes a while: not under m.mu, which every
	// Attach takes.
	for name, s := range stale {
		s.close(m.log, name)
	}
}

// Networks returns the configured networks.
func (m *Manager) Networks() []Network {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Network(nil), m.nets...)
}

// Close stops every main exec and releases the images held. Records stay.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	active := m.active
	m.active = map[string]*netState{}
	m.mu.Unlock()
	for name, s := range active {
		s.close(m.log, name)
	}
	if m.sbOwned {
		m.sb.Close()
	}
	return nil
}

func (s *netState) close(log *slog.Logger, name string) {
	if s.sv != nil {
		if err := s.sv.Close(); err != nil {
			log.Warn("stop main exec", "network", name, "err", err)
		}
	}
	s.release()
}

// Selection is one network a pod asks for, with the interface it wants
// ("" = the network's containerInterface template).
type Selection struct {
	Network string `json:"network"`
	IfName  string `json:"ifName,omitempty"`
}

// ParseSelection parses NAME or NAME@IFNAME.
func ParseSelection(s string) (Selection, error) {
	name, ifname, has := strings.Cut(s, "@")
	if !networkName.MatchString(name) {
		return Selection{}, fmt.Errorf("%w: network %q: not a valid network name", ErrBadRequest, s)
	}
	if has {
		if err := cni.ValidateIfName(ifname); err != nil {
			return Selection{}, fmt.Errorf("%w: network %q: %w", ErrBadRequest, s, err)
		}
	}
	return Selection{Network: name, IfName: ifname}, nil
}

// AttachRequest attaches one pod to networks.
type AttachRequest struct {
	// ID is the container (pod) UUID: the plugins' key for its state.
	ID string
	// Key is the record the attachments go to: "" or ID for the pod's one
	// record, or ID/… when a front door keeps several records of one pod
	// (the CNI meta mode keeps one per CNI attachment). Each record is
	// detached on its own; calls for one pod run one at a time, whatever
	// the record.
	Key string
	// NetNS is the pod's pinned network namespace (not a /proc path).
	NetNS string
	// Networks to attach, in order; empty = the default networks.
	Networks []Selection
	// Owner, when the pod has no record yet, is kept in it (PodRecord.Owner):
	// which front door made it (the CNI meta mode's GC collects only its own).
	Owner string
}

// key is the request's record key.
func (r AttachRequest) key() string {
	if r.Key == "" {
		return r.ID
	}
	return r.Key
}

// Skipped is an optional network whose add failed.
type Skipped struct {
	Network string `json:"network"`
	Error   string `json:"error"`
}

// AttachResult is what Attach did.
type AttachResult struct {
	// Attached are this call's new attachments, in order.
	Attached []AttachmentRecord `json:"attached"`
	// Skipped are optional networks whose add failed.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Pod is the pod's whole record afterwards.
	Pod PodRecord `json:"pod"`
}

var podID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

func checkPod(id, nsPath string) error {
	if !podID.MatchString(id) {
		return fmt.Errorf("%w: pod id %q: want 1-128 letters, digits, '_', '.', ':' or '-'", ErrBadRequest, id)
	}
	if nsPath == "" {
		return nil
	}
	if !filepath.IsAbs(nsPath) || filepath.Clean(nsPath) != nsPath {
		return fmt.Errorf("%w: netns %q: want an absolute, clean path", ErrBadRequest, nsPath)
	}
	if filepath.Dir(nsPath) == "/" {
		// Plugins see the pin's directory bound at its own path; / would
		// cover the image.
		return fmt.Errorf("%w: netns %q: pinned in /; pin the namespace in a directory (e.g. /run/netns)", ErrBadRequest, nsPath)
	}
	if nsPath == "/proc" || strings.HasPrefix(nsPath, "/proc/") {
		return fmt.Errorf("%w: netns %q: a /proc path cannot be used by plugins (they have their own /proc); pin the namespace (ip netns add, a bind mount) and pass the pin", ErrBadRequest, nsPath)
	}
	if err := isNetNS(nsPath); err != nil {
		return fmt.Errorf("%w: netns %q: %w", ErrBadRequest, nsPath, err)
	}
	return nil
}

// planned is one network of an Attach, resolved before anything runs.
type planned struct {
	net    Network
	ifname string
}

// Attach attaches the pod to the requested networks (or the defaults), in
// order. The pod may already have networks: these are added to them. If an
// add fails, the networks this call attached are detached again in reverse
// order and the error returned; an optional network's failure is skipped
// and reported instead. Invalid requests fail with ErrBadRequest before
// anything runs.
func (m *Manager) Attach(ctx context.Context, req AttachRequest) (res AttachResult, err error) {
	if req.NetNS == "" {
		return res, fmt.Errorf("%w: no netns", ErrBadRequest)
	}
	if err := checkPod(req.ID, req.NetNS); err != nil {
		return res, err
	}
	key := req.key()
	if err := checkKey(key); err != nil {
		return res, err
	}
	if podOfKey(key) != req.ID {
		return res, fmt.Errorf("%w: record key %q is not one of pod %s", ErrBadRequest, key, req.ID)
	}
	if m.checkNS != nil {
		if err := m.checkNS(req.NetNS); err != nil {
			return res, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	unlock := m.locks.Lock(req.ID)
	defer unlock()

	// Step 1: the record so far and the plan; no side effects yet.
	rec, found, err := m.getRecord(ctx, key)
	if err != nil {
		return res, err
	}
	if found && rec.NetNS != req.NetNS {
		return res, fmt.Errorf("%w: pod %s is attached with netns %s, not %s", ErrBadRequest, req.ID, rec.NetNS, req.NetNS)
	}
	if !found {
		rec = PodRecord{ID: req.ID, Key: key, NetNS: req.NetNS, Owner: req.Owner, Created: time.Now().UTC()}
	}
	plan, err := m.plan(req, rec)
	if err != nil {
		return res, err
	}

	// Step 2: the images (and main execs) of the networks, so that a bad
	// or unreachable image fails before any network is attached. Each is
	// held from here until the outcome is recorded (the record then keeps
	// it from being pruned): one ensure per network and call.
	states := make([]*netState, len(plan))
	unready := make([]error, len(plan)) // an optional network's ensure error
	var releases []func()
	defer func() {
		m.pruneMu.RLock()
		for _, r := range releases {
			r()
		}
		m.pruneMu.RUnlock()
	}()
	for i, p := range plan {
		if p.net.Builtin() {
			if m.pools == nil {
				return res, fmt.Errorf("network %q: %w", p.net.Name, ErrNoPools)
			}
			continue
		}
		s, release, err := m.ensure(ctx, p.net)
		if err != nil {
			if !p.net.Optional {
				return res, err
			}
			unready[i] = err
			continue
		}
		releases = append(releases, release)
		states[i] = s
	}

	// Step 3: one durable intent for every network of this call, the adds
	// in order, one durable outcome. A crash before the outcome leaves
	// every network of the call in StateAdding, and Recover deletes them
	// all (a del of a network whose add never ran is a del of nothing,
	// which plugins must accept as CNI's DEL does). On a failure the adds
	// of this call are deleted again in reverse.
	base := len(rec.Attachments)
	var todo []int // plan indexes recorded in the intent
	for i, p := range plan {
		if unready[i] != nil {
			m.log.Warn("optional pod network skipped", "pod", req.ID, "network", p.net.Name, "err", unready[i])
			res.Skipped = append(res.Skipped, Skipped{Network: p.net.Name, Error: unready[i].Error()})
			continue
		}
		a := AttachmentRecord{
			Network: p.net.Name, IfName: p.ifname, Config: p.net.Raw, Pool: p.net.Pool,
			Timeout: p.net.Timeout, State: StateAdding, Created: time.Now().UTC(),
		}
		if s := states[i]; s != nil {
			a.Image, a.Digest, a.Insecure = p.net.Image, s.img.Digest, p.net.Ref.Insecure
		}
		rec.Attachments = append(rec.Attachments, a)
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		res.Pod = rec
		return res, nil
	}
	if err := m.putRecord(ctx, rec); err != nil {
		return AttachResult{}, err
	}
	bg := context.WithoutCancel(ctx)
	// outcome[j]: nil added; else why not (the entry is then deleted).
	added := make([]bool, len(todo))
	var failure error
	for j, i := range todo {
		p, idx := plan[i], base+j
		err := m.addOne(ctx, &rec, idx, states[i])
		if err == nil {
			added[j] = true
			continue
		}
		// A failed add may have done part of its work: del it.
		m.dropEntry(bg, &rec, idx, true)
		if p.net.Optional {
			m.log.Warn("optional pod network skipped", "pod", req.ID, "network", p.net.Name, "err", err)
			res.Skipped = append(res.Skipped, Skipped{Network: p.net.Name, Error: err.Error()})
			continue
		}
		failure = fmt.Errorf("attach pod %s to network %q: %w", req.ID, p.net.Name, err)
		for k := j + 1; k < len(todo); k++ {
			m.dropEntry(bg, &rec, base+k, false) // never ran: nothing to del
		}
		for k := j - 1; k >= 0; k-- {
			if added[k] {
				m.dropEntry(bg, &rec, base+k, true)
			}
		}
		break
	}
	if failure == nil {
		var attached []AttachmentRecord
		for j := range todo {
			if added[j] {
				attached = append(attached, rec.Attachments[base+j])
			}
		}
		compact(&rec)
		err := m.putRecord(bg, rec)
		if err == nil {
			res.Attached, res.Pod = attached, rec
			return res, nil
		}
		// The outcome is not recorded: undo this call's adds (the stored
		// intent has them all as StateAdding, which Recover would undo).
		failure = err
		for k := len(rec.Attachments) - 1; k >= base; k-- {
			m.dropEntry(bg, &rec, k, true)
		}
	}
	compact(&rec)
	if err := m.putRecord(bg, rec); err != nil {
		m.log.Error("record the rollback of pod networks; Recover or a detach finishes it", "pod", req.ID, "err", err)
	}
	return AttachResult{}, failure
}

// addOne runs the add of rec.Attachments[idx] and fills in its outcome
// (in memory: the caller records it).
func (m *Manager) addOne(ctx context.Context, rec *PodRecord, idx int, s *netState) error {
	a := rec.Attachments[idx]
	if s != nil && s.sv != nil {
		if err := s.sv.Err(); err != nil {
			return err
		}
	}
	result, err := m.add(ctx, rec, a, s)
	if err == nil {
		a.Result, err = encodeResult(result)
	}
	if err != nil {
		return err
	}
	a.State = StateAttached
	rec.Attachments[idx] = a
	return nil
}

// dropEntry takes rec.Attachments[idx] out of the record in memory:
// deleted first when del is set; an entry whose del fails stays, marked
// StateDelFailed (Detach and GC retry it). Dropped entries are marked
// for compact.
func (m *Manager) dropEntry(ctx context.Context, rec *PodRecord, idx int, del bool) error {
	a := &rec.Attachments[idx]
	if del {
		if err := m.del(ctx, rec, *a); err != nil {
			m.log.Error("pod network del failed; its record stays for a later detach", "pod", rec.ID, "network", a.Network, "err", err)
			a.State, a.Error = StateDelFailed, err.Error()
			return err
		}
	}
	a.State = stateDropped
	return nil
}

// stateDropped marks an entry compact removes; it is never stored.
const stateDropped = "dropped"

// compact removes the dropped entries of rec.
func compact(rec *PodRecord) {
	kept := rec.Attachments[:0]
	for _, a := range rec.Attachments {
		if a.State != stateDropped {
			kept = append(kept, a)
		}
	}
	rec.Attachments = kept
}

// plan resolves the requested networks and renders their interface names.
func (m *Manager) plan(req AttachRequest, rec PodRecord) ([]planned, error) {
	nets := m.Networks()
	sels := req.Networks
	if len(sels) == 0 {
		for _, name := range Defaults(nets) {
			sels = append(sels, Selection{Network: name})
		}
		if len(sels) == 0 {
			return nil, fmt.Errorf("%w: no networks asked for and none is a default", ErrBadRequest)
		}
	}
	existing, err := m.links(req.NetNS)
	if err != nil {
		return nil, fmt.Errorf("list interfaces of %s: %w", req.NetNS, err)
	}
	taken := map[string]bool{}
	for _, l := range existing {
		taken[l] = true
	}
	attached := map[string]bool{}
	for _, a := range rec.Attachments {
		attached[a.Network] = true
		if a.IfName != "" {
			taken[a.IfName] = true
		}
	}
	var plan []planned
	for _, s := range sels {
		n, ok := Find(nets, s.Network)
		if !ok {
			return nil, fmt.Errorf("%w: unknown network %q", ErrBadRequest, s.Network)
		}
		if attached[n.Name] {
			return nil, fmt.Errorf("%w: pod %s is already attached to network %q (or asks for it twice)", ErrBadRequest, req.ID, n.Name)
		}
		attached[n.Name] = true
		ifname := s.IfName
		if ifname != "" {
			if err := cni.ValidateIfName(ifname); err != nil {
				return nil, fmt.Errorf("%w: network %q: %w", ErrBadRequest, n.Name, err)
			}
			if taken[ifname] {
				return nil, fmt.Errorf("%w: network %q: interface %q already exists in the pod", ErrBadRequest, n.Name, ifname)
			}
		} else {
			ifname, err = RenderIfName(n.ContainerInterface, req.ID, len(rec.Attachments)+len(plan), taken)
			if err != nil {
				return nil, fmt.Errorf("%w: network %q: %w", ErrBadRequest, n.Name, err)
			}
		}
		if ifname != "" {
			taken[ifname] = true
		}
		plan = append(plan, planned{net: n, ifname: ifname})
	}
	return plan, nil
}

// ensure returns the network's active state, acquiring its image and
// starting its main exec on first use, and a reference of the caller's own
// to its image (release it when done): the state's may be dropped at any
// moment by a reload, and the image pruned with it.
//
// One network's first use starts one main exec, however many attaches ask
// at once: the first starts it (m.starting), the others wait for it. A
// network planned from a config a reload has since replaced gets its image
// for this call and no main exec; the configured network's main exec is
// never touched from here (SetNetworks owns stopping it).
func (m *Manager) ensure(ctx context.Context, n Network) (*netState, func(), error) {
	if m.images == nil {
		return nil, nil, fmt.Errorf("network %q: no image cache configured", n.Name)
	}
	if _, _, err := m.sandbox(); err != nil {
		return nil, nil, fmt.Errorf("network %q: %w", n.Name, err)
	}
	for {
		m.mu.Lock()
		if s := m.active[n.Name]; s != nil && string(s.raw) == string(n.Raw) {
			// Under m.mu: a reload drops the state from m.active before
			// releasing its image.
			defer m.mu.Unlock()
			return m.hold(n.Name, s)
		}
		if cfg, ok := Find(m.nets, n.Name); !ok || string(cfg.Raw) != string(n.Raw) || m.closed {
			m.mu.Unlock()
			return m.ensureStale(ctx, n)
		}
		if st := m.starting[n.Name]; st != nil {
			m.mu.Unlock()
			select {
			case <-st:
				continue // started (or failed: then try ourselves)
			case <-ctx.Done():
				return nil, nil, fmt.Errorf("network %q: %w", n.Name, ctx.Err())
			}
		}
		st := make(chan struct{})
		m.starting[n.Name] = st
		m.mu.Unlock()

		// Fetching and starting take long: not under m.mu.
		s, err := m.start(ctx, n)

		m.mu.Lock()
		delete(m.starting, n.Name)
		close(st)
		if err != nil {
			m.mu.Unlock()
			return nil, nil, err
		}
		cfg, ok := Find(m.nets, n.Name)
		if ok && string(cfg.Raw) == string(n.Raw) && m.active[n.Name] == nil && !m.closed {
			m.active[n.Name] = s
			defer m.mu.Unlock()
			return m.hold(n.Name, s)
		}
		m.mu.Unlock()
		// A reload (or Close) came while it started: this call keeps the
		// image, the main exec stops.
		held, release, err := m.hold(n.Name, s)
		s.close(m.log, n.Name)
		return held, release, err
	}
}

// ensureStale serves a network planned from a config that is no longer
// the current one: its image only, for this call.
func (m *Manager) ensureStale(ctx context.Context, n Network) (*netState, func(), error) {
	img, release, err := m.images.Acquire(ctx, n.Ref)
	if err != nil {
		return nil, nil, fmt.Errorf("network %q: image: %w", n.Name, err)
	}
	return &netState{raw: n.Raw, img: img, release: release}, release, nil
}

// hold takes the caller's own reference to s's image while s still holds
// its own.
func (m *Manager) hold(name string, s *netState) (*netState, func(), error) {
	_, release, err := m.images.Lookup(s.img.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("network %q: image: %w", name, err)
	}
	return s, release, nil
}

// start acquires a network's image and starts its main exec, if it has
// one.
func (m *Manager) start(ctx context.Context, n Network) (*netState, error) {
	sb, _, err := m.sandbox()
	if err != nil {
		return nil, fmt.Errorf("network %q: %w", n.Name, err)
	}
	img, release, err := m.images.Acquire(ctx, n.Ref)
	if err != nil {
		return nil, fmt.Errorf("network %q: image: %w", n.Name, err)
	}
	s := &netState{raw: n.Raw, img: img, release: release}
	if len(img.MainExec) == 0 {
		return s, nil
	}
	dir, err := m.stateDir(n.Name)
	if err == nil && !filepath.IsAbs(img.MainExec[0]) {
		err = fmt.Errorf("main exec %q: want an absolute path", img.MainExec[0])
	}
	if err == nil {
		s.sv, err = sb.Supervise(sandbox.SupervisorOptions{
			Network: n.Name,
			Spec: sandbox.Spec{
				Rootfs: img.Root, Path: img.MainExec[0], Args: img.MainExec[1:],
				Stdin: n.Raw, Env: img.Env, StateDir: dir,
			},
			Logger: m.log,
		})
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("network %q: start main exec: %w", n.Name, err)
	}
	return s, nil
}

func (m *Manager) stateDir(network string) (string, error) {
	dir := filepath.Join(m.state, network)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("state directory of network %q: %w", network, err)
	}
	return dir, nil
}

// detachOne runs a's del and removes it from the record (rec is updated
// and written). If the del fails the entry stays, marked StateDelFailed.
func (m *Manager) detachOne(ctx context.Context, rec *PodRecord, a AttachmentRecord) error {
	delErr := m.del(ctx, rec, a)
	for i := range rec.Attachments {
		if rec.Attachments[i].Network != a.Network {
			continue
		}
		if delErr != nil {
			rec.Attachments[i].State = StateDelFailed
			rec.Attachments[i].Error = delErr.Error()
		} else {
			rec.Attachments = append(rec.Attachments[:i], rec.Attachments[i+1:]...)
		}
		break
	}
	if err := m.putRecord(ctx, *rec); err != nil {
		return errors.Join(delErr, err)
	}
	return delErr
}

// Detach removes all of a pod's networks, those of every record of the
// pod, each record's in reverse order of attachment, each del from its
// record (the config and image it was added with). It is idempotent: a pod
// without a record is already detached. If some del fails, the others
// still run, the failed ones stay recorded, and the error lists them.
func (m *Manager) Detach(ctx context.Context, id string) error {
	if err := checkPod(id, ""); err != nil {
		return err
	}
	recs, err := m.listRecords(ctx)
	if err != nil {
		return err
	}
	keys := []string{id}
	for _, r := range recs {
		if r.ID == id && r.StoreKey() != id {
			keys = append(keys, r.StoreKey())
		}
	}
	var errs []error
	for _, k := range keys {
		if _, err := m.DetachIf(ctx, k, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DetachIf detaches the networks of the record stored under key (a pod's
// ID or an AttachRequest.Key) when still, given the record as it is once
// the pod's calls are serialized, says so (nil: always). A collector checks
// there that the record it decided on is the one it removes, not the same
// pod attached again since. It reports whether it detached; a key with no
// record is already detached.
func (m *Manager) DetachIf(ctx context.Context, key string, still func(PodRecord) bool) (bool, error) {
	return m.detach(ctx, key, still, nil)
}

// DetachLost is DetachIf of req's record for a front door that knows what
// the pod asked for (the CNI meta mode's DEL, which may come after the
// store lost the record). With a record it is DetachIf. Without one it
// frees what it still
// can, under the pod's lock (no attach of the pod runs meanwhile): first
// orphans (the caller's: what skeind's own pools hold for the pod), then,
// in reverse order, a del of each image network of req.Networks (the
// defaults when empty) from the current config, each failure logged (a
// del is idempotent; the network may have changed since). A pod in no
// config and no record has nothing left to do.
func (m *Manager) DetachLost(ctx context.Context, req AttachRequest, orphans func(context.Context) error) error {
	_, err := m.detach(ctx, req.key(), nil, func() error {
		var err error
		if orphans != nil {
			err = orphans(ctx)
		}
		m.delUnrecorded(ctx, req)
		return err
	})
	return err
}

// delUnrecorded runs the best-effort dels of DetachLost.
func (m *Manager) delUnrecorded(ctx context.Context, req AttachRequest) {
	nets := m.Networks()
	sels := req.Networks
	if len(sels) == 0 {
		for _, name := range Defaults(nets) {
			sels = append(sels, Selection{Network: name})
		}
	}
	rec := PodRecord{ID: req.ID, NetNS: req.NetNS}
	for i := len(sels) - 1; i >= 0; i-- {
		n, ok := Find(nets, sels[i].Network)
		if !ok || n.Builtin() {
			continue
		}
		ifname := sels[i].IfName
		if ifname == "" {
			// As the add rendered it, unless the template is random.
			ifname, _ = RenderIfName(n.ContainerInterface, req.ID, i, map[string]bool{})
		}
		// Only an image at hand: a DEL never waits on a registry.
		digest := n.Ref.Digest.String()
		m.mu.Lock()
		if s := m.active[n.Name]; s != nil && string(s.raw) == string(n.Raw) {
			digest = s.img.Digest
		}
		m.mu.Unlock()
		var err error
		switch {
		case n.Ref.Pinned() || digest != n.Ref.Digest.String():
			a := AttachmentRecord{Network: n.Name, IfName: ifname, Config: n.Raw, Image: n.Image,
				Digest: digest, Insecure: n.Ref.Insecure, Timeout: n.Timeout}
			err = m.del(ctx, &rec, a)
		case n.Ref.Scheme == image.SchemeFile:
			// An unpinned local archive, pruned with the record that
			// was lost: reading it again needs no network, only its
			// timeout.
			err = m.delLostLocal(ctx, &rec, n, ifname)
		default:
			err = fmt.Errorf("image %s: not pinned and not in use: %w", n.Image, ErrImageGone)
		}
		if err != nil {
			m.log.Warn("del of an unrecorded pod network failed", "pod", req.ID, "network", n.Name, "err", err)
		}
	}
}

// delLostLocal runs network n's del for a pod without a record when n's
// image is an unpinned file:// archive no longer in the cache: the
// archive is read again (bounded by n's timeout), the del run, the image
// released.
func (m *Manager) delLostLocal(ctx context.Context, rec *PodRecord, n Network, ifname string) error {
	tctx, cancel := context.WithTimeout(ctx, n.Timeout)
	st, release, err := m.ensure(tctx, n)
	cancel()
	if err != nil {
		return fmt.Errorf("image %s: read it again for the del: %w", n.Image, err)
	}
	defer release()
	a := AttachmentRecord{Network: n.Name, IfName: ifname, Config: n.Raw, Image: n.Image,
		Digest: st.img.Digest, Insecure: n.Ref.Insecure, Timeout: n.Timeout}
	return m.del(ctx, rec, a)
}

// detach is DetachIf; lost, when set, runs under the pod's lock if there
// is no record under key.
func (m *Manager) detach(ctx context.Context, key string, still func(PodRecord) bool, lost func() error) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	id := podOfKey(key)
	unlock := m.locks.Lock(id)
	defer unlock()
	rec, found, err := m.getRecord(ctx, key)
	if err == nil && !found && lost != nil {
		err = lost()
	}
	if err != nil || !found {
		return false, err
	}
	if still != nil && !still(rec) {
		return false, nil
	}
	// Once begun, a detach runs to its end: a del cut short, or a record
	// not updated after a del that ran, would only leave work for a retry
	// (the plugin calls have their own timeouts).
	bg := context.WithoutCancel(ctx)
	var errs []error
	var gone []string // digests of the images of the entries deleted
	for i := len(rec.Attachments) - 1; i >= 0; i-- {
		a := rec.Attachments[i]
		if err := m.dropEntry(bg, &rec, i, true); err != nil {
			errs = append(errs, fmt.Errorf("detach pod %s from network %q: %w", id, a.Network, err))
		} else if a.Digest != "" {
			gone = append(gone, a.Digest)
		}
	}
	// One write for the whole pod: the record goes, or keeps the entries
	// whose del failed. A crash before it leaves the record as it was, and
	// the next detach dels again (a del of what is gone succeeds).
	compact(&rec)
	if err := m.putRecord(bg, rec); err != nil {
		errs = append(errs, err)
	}
	if m.prunable(gone) {
		m.prune(bg)
	}
	return true, errors.Join(errs...)
}

// Status returns the pod's networks: its record, or when it has several
// (AttachRequest.Key), one record holding the attachments of them all, in
// the order they were made. ErrUnknownPod when it has none.
func (m *Manager) Status(ctx context.Context, id string) (PodRecord, error) {
	if err := checkPod(id, ""); err != nil {
		return PodRecord{}, err
	}
	rec, found, err := m.getRecord(ctx, id)
	if err != nil {
		return rec, err
	}
	recs, err := m.listRecords(ctx)
	if err != nil {
		return PodRecord{}, err
	}
	for _, r := range recs {
		if r.ID != id || r.StoreKey() == id {
			continue
		}
		if !found {
			rec, found = PodRecord{ID: id, NetNS: r.NetNS, Owner: r.Owner, Created: r.Created}, true
		}
		rec.Attachments = append(rec.Attachments, r.Attachments...)
		if r.Created.Before(rec.Created) {
			rec.Created = r.Created
		}
	}
	if !found {
		return rec, fmt.Errorf("pod %s: %w", id, ErrUnknownPod)
	}
	slices.SortStableFunc(rec.Attachments, func(a, b AttachmentRecord) int { return a.Created.Compare(b.Created) })
	return rec, nil
}

// Record returns the record stored under key (a pod's ID or an
// AttachRequest.Key); ErrUnknownPod when there is none.
func (m *Manager) Record(ctx context.Context, key string) (PodRecord, error) {
	if err := checkKey(key); err != nil {
		return PodRecord{}, err
	}
	rec, found, err := m.getRecord(ctx, key)
	if err != nil {
		return rec, err
	}
	if !found {
		return rec, fmt.Errorf("pod record %s: %w", key, ErrUnknownPod)
	}
	return rec, nil
}

// List returns every pod record.
func (m *Manager) List(ctx context.Context) ([]PodRecord, error) {
	return m.listRecords(ctx)
}

// Recover finishes what a crash interrupted: entries still StateAdding
// (an add that never reported) are deleted and dropped; then unused images
// are pruned. Call it once at start, before serving.
func (m *Manager) Recover(ctx context.Context) error {
	recs, err := m.listRecords(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		unlock := m.locks.Lock(r.ID)
		rec, found, err := m.getRecord(ctx, r.StoreKey())
		if err == nil && found {
			for i := len(rec.Attachments) - 1; i >= 0; i-- {
				if a := rec.Attachments[i]; a.State == StateAdding {
					if derr := m.detachOne(ctx, &rec, a); derr != nil {
						errs = append(errs, fmt.Errorf("roll back interrupted add of pod %s to %q: %w", r.ID, a.Network, derr))
					}
				}
			}
		}
		unlock()
		if err != nil {
			errs = append(errs, err)
		}
	}
	m.prune(ctx)
	return errors.Join(errs...)
}

// GC detaches every pod record for which keep (given the pod's ID)
// returns false and that was created before since (a pod attached after
// the caller took its list is not garbage). It returns the pods detached.
func (m *Manager) GC(ctx context.Context, since time.Time, keep func(id string) bool) ([]string, error) {
	recs, err := m.listRecords(ctx)
	if err != nil {
		return nil, err
	}
	var gone []string
	var errs []error
	for _, r := range recs {
		if keep(r.ID) || !r.Created.Before(since) {
			continue
		}
		detached, err := m.DetachIf(ctx, r.StoreKey(), func(cur PodRecord) bool { return cur.Created.Before(since) })
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if detached {
			gone = append(gone, r.ID)
		}
	}
	return gone, errors.Join(errs...)
}

// prunable reports whether images with these digests may have become
// unused: some digest is not the image of a network that is configured
// and started (those hold their images, so a prune would remove nothing
// of theirs). A detach of pods on configured networks, the common case,
// then costs no listing of every record.
func (m *Manager) prunable(digests []string) bool {
	if len(digests) == 0 || m.images == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	held := map[string]bool{}
	for _, s := range m.active {
		held[s.img.Digest] = true
	}
	for _, d := range digests {
		if !held[d] {
			return true
		}
	}
	return false
}

// prune removes cached images no record and no configured network holds.
func (m *Manager) prune(ctx context.Context) {
	if m.images == nil {
		return
	}
	m.pruneMu.Lock()
	defer m.pruneMu.Unlock()
	all, err := m.st.ListMeta(ctx, MetaKind)
	if err != nil {
		m.log.Warn("image prune skipped", "err", err)
		return
	}
	// A record that does not decode may name any image: prune nothing.
	var recs []PodRecord
	for key, b := range all {
		var r PodRecord
		if err := json.Unmarshal(b, &r); err != nil {
			m.log.Warn("image prune skipped: a pod record does not decode", "key", key, "err", err)
			return
		}
		recs = append(recs, r)
	}
	inUse := map[string]bool{}
	for _, r := range recs {
		for _, a := range r.Attachments {
			if a.Digest != "" {
				inUse[a.Digest] = true
			}
		}
	}
	removed, err := m.images.Prune(inUse)
	if err != nil {
		m.log.Warn("image prune", "err", err)
	}
	if len(removed) > 0 {
		m.log.Info("pruned unused plugin images", "digests", removed)
	}
}

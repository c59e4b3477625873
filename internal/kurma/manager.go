package kurma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

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
	vol      store.Store // the store's volatile tier, if it has one (putCompletion)
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
	if t, ok := o.Store.(interface{ Volatile() store.Store }); ok {
		m.vol = t.Volatile()
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

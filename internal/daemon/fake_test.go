package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
)

// fakeKernel is a Kernel kept in memory: a map of host links. Errors are
// injected per method; the fake otherwise behaves as the dataplane's
// contract says (Setup all or nothing, Teardown idempotent).
type fakeKernel struct {
	mu    sync.Mutex
	cfg   dataplane.Config
	links map[string]fakeLink
	// Injected failures (nil: succeed).
	setupErr, teardownErr, retagErr error
	// setupLeaves makes a failing Setup leave its link behind, as a
	// Setup whose undo failed does.
	setupLeaves bool
	exported    []netip.Prefix
	// setupHook, if set, runs at the start of every Setup (unlocked).
	setupHook func()
}

type fakeLink struct {
	alias string
	netns string
	addrs []netip.Addr
}

var _ Kernel = (*fakeKernel)(nil)

func newFakeKernel() *fakeKernel {
	return &fakeKernel{
		cfg: dataplane.Config{
			AliasPrefix: dataplane.DefaultAliasPrefix,
			GatewayV4:   dataplane.DefaultGatewayV4,
			GatewayV6:   dataplane.DefaultGatewayV6,
			PodTable:    dataplane.DefaultPodTable,
			ExportTable: dataplane.DefaultExportTable,
		},
		links: map[string]fakeLink{},
	}
}

func (k *fakeKernel) Init() error { return nil }

func (k *fakeKernel) Setup(l dataplane.Link) (dataplane.Applied, error) {
	k.mu.Lock()
	hook := k.setupHook
	k.mu.Unlock()
	if hook != nil {
		hook()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.links[l.HostName]; ok {
		return dataplane.Applied{}, fmt.Errorf("host veth %q: %w", l.HostName, dataplane.ErrLinkExists)
	}
	if !strings.HasPrefix(l.Alias, k.cfg.AliasPrefix) || len(l.Alias) > dataplane.MaxAliasLen {
		return dataplane.Applied{}, fmt.Errorf("alias %q does not fit: %w", l.Alias, dataplane.ErrInvalid)
	}
	if k.setupErr != nil {
		if k.setupLeaves {
			k.links[l.HostName] = fakeLink{alias: l.Alias, netns: l.NetNS, addrs: l.Addrs}
		}
		return dataplane.Applied{}, k.setupErr
	}
	k.links[l.HostName] = fakeLink{alias: l.Alias, netns: l.NetNS, addrs: l.Addrs}
	return dataplane.Applied{HostIndex: len(k.links)}, nil
}

func (k *fakeKernel) SetupPair(p dataplane.Pair) (dataplane.Applied, error) {
	return k.Setup(dataplane.Link{HostName: p.HostName, Alias: p.Alias, NetNS: "node", IfName: p.PeerName, Addrs: p.Addrs})
}

func (k *fakeKernel) Teardown(host, _, _ string, _ []netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.teardownErr != nil {
		return k.teardownErr
	}
	delete(k.links, host)
	return nil
}

func (k *fakeKernel) Check(dataplane.Link) error { return nil }

func (k *fakeKernel) Scan() ([]dataplane.Found, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []dataplane.Found
	for name, l := range k.links {
		out = append(out, dataplane.Found{HostName: name, Alias: l.alias, Addrs: slices.Clone(l.addrs)})
	}
	slices.SortFunc(out, func(a, b dataplane.Found) int { return strings.Compare(a.HostName, b.HostName) })
	return out, nil
}

func (k *fakeKernel) Retag(host, alias string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.retagErr != nil {
		return k.retagErr
	}
	l, ok := k.links[host]
	if !ok {
		return fmt.Errorf("retag %s: no such link", host)
	}
	l.alias = alias
	k.links[host] = l
	return nil
}

func (k *fakeKernel) SetExportedBlocks(b []netip.Prefix) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.exported = slices.Clone(b)
	return nil
}

func (k *fakeKernel) Config() dataplane.Config { return k.cfg }
func (k *fakeKernel) Close() error             { return nil }

// addLink puts a link in the fake kernel directly (state left by an
// earlier run).
func (k *fakeKernel) addLink(host, alias string, addrs ...netip.Addr) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.links[host] = fakeLink{alias: alias, addrs: addrs}
}

func (k *fakeKernel) link(host string) (fakeLink, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, ok := k.links[host]
	return l, ok
}

func (k *fakeKernel) linkNames() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for n := range k.links {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (k *fakeKernel) fail(setup, teardown error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setupErr, k.teardownErr = setup, teardown
}

// faultyStore is the real embedded store with failures injected into the
// attachment writes.
type faultyStore struct {
	store.Store
	mu                sync.Mutex
	putErr, deleteErr error
	// onList, if set, runs before ListAttachments reads.
	onList func()
}

func (s *faultyStore) ListAttachments(ctx context.Context) ([]store.Attachment, error) {
	s.mu.Lock()
	hook := s.onList
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return s.Store.ListAttachments(ctx)
}

func (s *faultyStore) fail(put, del error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putErr, s.deleteErr = put, del
}

func (s *faultyStore) PutAttachment(ctx context.Context, a store.Attachment) error {
	s.mu.Lock()
	err := s.putErr
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.Store.PutAttachment(ctx, a)
}

func (s *faultyStore) DeleteAttachment(ctx context.Context, k store.AttachmentKey) error {
	s.mu.Lock()
	err := s.deleteErr
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.Store.DeleteAttachment(ctx, k)
}

var errBoom = errors.New("boom")

// testNode is one daemon over a fake kernel and a faulty store, which can
// be restarted over the same store file and kernel.
type testNode struct {
	t      testing.TB
	path   string
	kernel *fakeKernel
	st     *faultyStore
	d      *Daemon
	log    *harness.SyncBuffer
	cfg    Config
}

// newTestNode starts a daemon with pool "p" (10.0.0.0/24 and fd00::/120,
// unless cfg names pools) on a fresh store.
func newTestNode(t testing.TB, cfg Config) *testNode {
	t.Helper()
	if cfg.Pools == nil {
		cfg.Pools = []PoolSpec{{Name: "p", Subnets: []string{"10.0.0.0/24", "fd00::/120"}}}
	}
	n := &testNode{t: t, path: filepath.Join(t.TempDir(), "skein.db"), kernel: newFakeKernel(), cfg: cfg}
	if err := n.start(); err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	t.Cleanup(func() {
		if n.d != nil {
			n.d.Close()
		}
	})
	return n
}

func (n *testNode) start() error {
	bolt, err := store.OpenBolt(n.path, store.BoltOptions{})
	if err != nil {
		return err
	}
	n.st = &faultyStore{Store: bolt}
	n.log = &harness.SyncBuffer{}
	cfg := n.cfg
	cfg.Node, cfg.MetricsAddr = "n1", "off"
	cfg.Store, cfg.Kernel = n.st, n.kernel
	cfg.Logger = slog.New(slog.NewTextHandler(n.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d, err := New(context.Background(), cfg)
	if err != nil {
		bolt.Close()
		return err
	}
	n.d = d
	return nil
}

// restart closes the daemon and starts a new one over the same store and
// kernel.
func (n *testNode) restart() error {
	n.t.Helper()
	if n.d != nil {
		n.d.Close()
		n.d = nil
	}
	return n.start()
}

// used is how many addresses pool holds in the allocator.
func (n *testNode) used(pool string) uint64 {
	n.t.Helper()
	u, err := n.d.ipam.Usage(context.Background(), pool)
	if err != nil {
		n.t.Fatal(err)
	}
	return u.Used
}

func (n *testNode) records() []store.Attachment {
	n.t.Helper()
	atts, err := n.st.ListAttachments(context.Background())
	if err != nil {
		n.t.Fatal(err)
	}
	store.SortAttachments(atts)
	return atts
}

func key(id string) store.AttachmentKey {
	return store.AttachmentKey{Network: "net", ContainerID: id, IfName: "eth0"}
}

func attachReq(id string) AttachRequest {
	return AttachRequest{Key: key(id), Pool: "p", NetNS: "/run/netns/" + id, Owner: OwnerCNI}
}

// pinnedNS pins a new network namespace under a temporary directory of t
// and returns its path; it is removed when t ends. Unless the process runs
// as root it skips t, saying why the test needs the namespace.
func pinnedNS(t testing.TB, name, why string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := netns.Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(path) })
	return path
}

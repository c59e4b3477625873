package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/api/rpcwire"
	"github.com/skeinnet/skein/internal/cniwire"
	"github.com/skeinnet/skein/internal/cniwire/wireserver"
	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/keylock"
	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/internal/unixsock"
)

// Version is set at build time.
var Version = "dev"

// PoolSpec is a pool skeind creates at start if it does not exist.
type PoolSpec struct {
	Name          string   `json:"name"`
	Subnets       []string `json:"subnets"`
	BlockSizeBits int      `json:"blockSizeBits,omitempty"`
	Reserved      []string `json:"reserved,omitempty"`
}

// Config configures skeind. Zero values are documented per field.
type Config struct {
	// Node is this node's name; "" = the host name.
	Node string `json:"node,omitempty"`
	// StateDir holds the embedded store; "" = /var/lib/skein.
	StateDir string `json:"stateDir,omitempty"`
	// Socket is the gRPC socket; "" = /run/skein/skeind.sock.
	Socket string `json:"socket,omitempty"`
	// VolatileStore is the file of the attachment records a reboot voids
	// (the CNI front door's: see store.Tiered); "" = beside Socket,
	// <Socket without .sock>-attachments.db (on /run, a tmpfs, by default).
	VolatileStore string `json:"volatileStore,omitempty"`
	// MetricsAddr serves /metrics, /healthz and /readyz; it must be a
	// loopback address. "" = 127.0.0.1:9383; "off" disables.
	MetricsAddr string `json:"metricsAddr,omitempty"`
	// Dataplane options; zero values per dataplane.Config.
	Dataplane dataplane.Config `json:"dataplane"`
	// Pools are created at start when absent.
	Pools []PoolSpec `json:"pools,omitempty"`
	// PodNetworks is the list of Kurma-style pod networks (package
	// internal/kurma documents an entry); PodNetworksAlias is the same
	// list under Kurma's documented key pod_networks. Empty: none. Only
	// this part of the config is reloaded on SIGHUP.
	PodNetworks      json.RawMessage `json:"podNetworks,omitempty"`
	PodNetworksAlias json.RawMessage `json:"pod_networks,omitempty"`
	// Routing between nodes; zero values per RoutingConfig. The daemon
	// reads only Mode (ListRoutes without Routes); skeind builds the
	// routing from it.
	Routing RoutingConfig `json:"routing"`
	// ReconcileForce lets the start-up reconcile delete host links the
	// store cannot account for (see ErrStoreMismatch); false refuses to
	// start instead. A one-off flag, never read from a config file.
	ReconcileForce bool `json:"-"`
	// Logger; nil = slog.Default().
	Logger *slog.Logger `json:"-"`
	// Store, if set, is used instead of the embedded store under
	// StateDir; the daemon closes it. (Unit tests pass a fake.)
	Store store.Store `json:"-"`
	// Blocks tunes block handling when Store is shared by a cluster
	// (ipam.ClusterStore: the Kubernetes store): how long an empty block
	// is kept, and so on. The zero value is usable.
	Blocks ipam.ClusterOptions `json:"-"`
	// Routes, if set, answers ListRoutes; its metrics (when it has
	// Collectors) are served with the daemon's. Nil: an empty list.
	Routes Routes `json:"-"`
	// Kernel, if set, is used instead of a dataplane.Dataplane built from
	// Dataplane; the daemon closes it. (Unit tests pass a fake.)
	Kernel Kernel `json:"-"`
	// PodHook, if set, runs on the CNI ADD and DEL of Kubernetes pods
	// (egress tunnels in the Kubernetes mode); its metrics (when it has
	// Collectors) are served with the daemon's. Nil: none.
	PodHook PodHook `json:"-"`
}

// Defaults.
const (
	DefaultStateDir    = "/var/lib/skein"
	DefaultSocket      = "/run/skein/skeind.sock"
	DefaultMetricsAddr = "127.0.0.1:9383"
)

// VolatileStorePath is where VolatileStore is.
func (c Config) VolatileStorePath() string {
	if c.VolatileStore != "" {
		return c.VolatileStore
	}
	sock := c.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	return strings.TrimSuffix(sock, ".sock") + "-attachments.db"
}

// OpenTiered puts durable under a store.Tiered whose volatile file (at
// VolatileStorePath) keeps the CNI front door's attachment records: a
// pod's record lives as long as its network namespace, which no reboot
// keeps either, so it is written without a sync (docs/architecture.md).
// checkPools: durable holds the pools.
func (c Config) OpenTiered(durable store.Store, checkPools bool) (*store.Tiered, error) {
	return store.OpenTiered(context.Background(), durable, store.TieredOptions{
		Path:       c.VolatileStorePath(),
		Volatile:   func(a store.Attachment) bool { return a.Owner == OwnerCNI },
		CheckPools: checkPools,
		Force:      c.ReconcileForce,
	})
}

// Daemon is a running skeind.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	st       store.Store
	ipam     *ipam.Manager
	dp       Kernel
	dpConfig dataplane.Config
	locks    keylock.Locks
	adds     inflight
	pods     *kurma.Manager
	// hostNS: namespaces no pod may be plumbed into (checkPodNetNS).
	hostNS  map[netns.ID]string
	metrics *metrics
	started time.Time

	exportMu   sync.Mutex
	exportKick chan struct{}
	done       chan struct{}

	grpc *grpc.Server
	// wire: the services the short path serves (RegisterCNIMethods);
	// split shares the socket between it, gRPC and frames, which serves
	// every registered service's unary methods without HTTP/2.
	wire    map[string]rpc.CNIMethods
	split   *cniwire.Split
	frames  *rpcwire.Server
	onStop  []func()
	http    *http.Server
	closeMu sync.Mutex
	closed  bool
	wg      sync.WaitGroup
}

// New opens the store, programs the node's base dataplane state and
// reconciles. It does not serve yet (see Serve).
func New(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	if cfg.Node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("node name: %w", err)
		}
		cfg.Node = h
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if cfg.MetricsAddr == "" {
		cfg.MetricsAddr = DefaultMetricsAddr
	}
	if cfg.MetricsAddr != "off" {
		if err := checkLoopback(cfg.MetricsAddr); err != nil {
			return nil, err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, started: time.Now(), exportKick: make(chan struct{}, 1), done: make(chan struct{})}
	d.metrics = newMetrics(d)

	st := cfg.Store
	if st == nil {
		durable, err := store.OpenBolt(filepath.Join(cfg.StateDir, "skein.db"), store.BoltOptions{})
		if err != nil {
			return nil, err
		}
		if st, err = cfg.OpenTiered(durable, true); err != nil {
			durable.Close()
			return nil, err
		}
	}
	d.st = st
	d.metrics.registerStore(st)
	d.metrics.registerStore(cfg.Routes)
	d.metrics.registerStore(cfg.PodHook)
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	blocks := cfg.Blocks
	if r, ok := st.(interface {
		BlockLost(pool string, index uint32, held int)
	}); ok && blocks.OnBlockLost == nil {
		blocks.OnBlockLost = r.BlockLost
	}
	d.ipam, err = ipam.NewManager(ipam.Options{Store: st, Node: cfg.Node, OnBlocksChanged: d.kickExport, Cluster: blocks, Logger: d.log})
	if err != nil {
		return nil, err
	}
	dp := cfg.Kernel
	if dp == nil {
		if dp, err = dataplane.New(cfg.Dataplane); err != nil {
			return nil, fmt.Errorf("dataplane: %w", err)
		}
	}
	d.dp = dp
	d.dpConfig = dp.Config()
	defer func() {
		if err != nil {
			dp.Close()
		}
	}()
	if err := dp.Init(); err != nil {
		return nil, fmt.Errorf("dataplane init: %w", err)
	}
	d.hostNS = hostNamespaces(d.dpConfig.NodeNetNS, d.log)
	for _, p := range cfg.Pools {
		if err := d.ensurePool(ctx, p); err != nil {
			return nil, err
		}
	}
	if err := d.reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	if err := d.startPods(ctx); err != nil {
		return nil, fmt.Errorf("pod networks: %w", err)
	}
	d.grpc = grpc.NewServer(grpc.UnaryInterceptor(recoverUnary(d.log)))
	d.frames = rpcwire.NewServer()
	cs := &cniServer{d: d}
	rpc.RegisterCNIServer(d.GRPC(), cs)
	d.wire = map[string]rpc.CNIMethods{}
	d.RegisterCNIMethods(rpc.CNI_ServiceDesc.ServiceName, cs)
	rpc.RegisterAdminServer(d.GRPC(), &adminServer{d: d})
	rpc.RegisterPodsServer(d.GRPC(), &podsServer{d: d})
	return d, nil
}

// GRPC is where services are registered, before Serve: front doors in
// other packages register theirs there. Each is served over gRPC and over
// the framed unary path (package rpcwire) alike.
func (d *Daemon) GRPC() grpc.ServiceRegistrar { return both{d.grpc, d.frames} }

// both registers a service on two servers.
type both [2]grpc.ServiceRegistrar

func (b both) RegisterService(desc *grpc.ServiceDesc, impl any) {
	b[0].RegisterService(desc, impl)
	b[1].RegisterService(desc, impl)
}

// RegisterCNIMethods serves m's methods (a service registered on the gRPC
// server) as /<service>/<Method> on the CNI binaries' short path too
// (package cniwire); call it with the gRPC registration, before Serve.
func (d *Daemon) RegisterCNIMethods(service string, m rpc.CNIMethods) {
	d.wire[service] = m
}

// OnStop registers f to run when the daemon closes, before the store is
// closed (front doors stop their own servers there). Not safe to call
// concurrently with Close.
func (d *Daemon) OnStop(f func()) { d.onStop = append(d.onStop, f) }

// Logger is the daemon's logger.
func (d *Daemon) Logger() *slog.Logger { return d.log }

// Dataplane is the kernel programming layer, for front doors.
func (d *Daemon) Dataplane() Kernel { return d.dp }

// Node is this node's name.
func (d *Daemon) Node() string { return d.cfg.Node }

// Observe records a front door's request in the metrics; code 0 is success.
func (d *Daemon) Observe(frontdoor, verb string, code uint, took time.Duration) {
	d.metrics.observe(frontdoor, verb, code, took)
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics address %q: %w", addr, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("metrics address %q: must be a loopback IP address (127.0.0.1 or ::1)", addr)
	}
	return nil
}

func (d *Daemon) ensurePool(ctx context.Context, s PoolSpec) error {
	if _, err := d.st.GetPool(ctx, s.Name); err == nil {
		return nil
	}
	p := store.Pool{Name: s.Name, BlockSizeBits: s.BlockSizeBits, Reserved: s.Reserved}
	for _, sn := range s.Subnets {
		pr, err := netip.ParsePrefix(sn)
		if err != nil {
			return fmt.Errorf("pool %q: subnet %q: %w", s.Name, sn, err)
		}
		p.Subnets = append(p.Subnets, pr)
	}
	if _, err := d.ipam.CreatePool(ctx, p); err != nil && !errors.Is(err, store.ErrExists) {
		return fmt.Errorf("create pool %q: %w", s.Name, err)
	}
	d.log.Info("pool created from configuration", "pool", s.Name, "subnets", s.Subnets)
	return nil
}

// Store exposes the store to front doors in this process.
func (d *Daemon) Store() store.Store { return d.st }

// IPAM exposes the address manager to front doors in this process.
func (d *Daemon) IPAM() *ipam.Manager { return d.ipam }

// Serve listens on the socket (and the metrics address) and serves until
// ctx ends or Close is called. extra registers more services on the
// gRPC server (front doors living in other packages).
func (d *Daemon) Serve(ctx context.Context) error {
	l, err := unixsock.Listen("unix", d.cfg.Socket) // mode 0600 from the start
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	if d.cfg.MetricsAddr != "off" {
		ml, err := net.Listen("tcp", d.cfg.MetricsAddr)
		if err != nil {
			l.Close()
			return fmt.Errorf("listen %s: %w", d.cfg.MetricsAddr, err)
		}
		d.http = &http.Server{Handler: d.metrics.handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := d.http.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	d.wg.Add(2)
	go d.exportLoop(ctx)
	go func() {
		// With a store shared by a cluster: spare blocks, blocks given
		// back, pools and ownership followed (nothing otherwise).
		defer d.wg.Done()
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-d.done:
				cancel()
			case <-rctx.Done():
			}
		}()
		d.ipam.Run(rctx)
	}()
	// The CNI binaries' short path and gRPC share the socket.
	d.closeMu.Lock()
	d.split = cniwire.NewSplit(l, wireserver.RunHandler(d.wire),
		cniwire.Route{Magic: rpcwire.Magic, Serve: d.frames.Serve})
	d.closeMu.Unlock()
	go func() { errc <- d.grpc.Serve(d.split.Listener()) }()
	d.log.Info("skeind serving", "socket", d.cfg.Socket, "metrics", d.cfg.MetricsAddr, "node", d.cfg.Node,
		"store", d.st.Describe(), "version", Version)
	select {
	case <-ctx.Done():
		d.Close()
		return nil
	case err := <-errc:
		d.Close()
		return err
	}
}

// Close stops serving (finishing calls in flight) and closes the store.
// Kernel state stays: attachments outlive the daemon.
func (d *Daemon) Close() error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	// No new call on a kept framed connection from here on (idle ones
	// close now, busy ones once their reply is out).
	if d.frames != nil {
		d.frames.Close()
	}
	if d.grpc != nil {
		// Let calls in flight finish, but not forever.
		stopped := make(chan struct{})
		go func() { d.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			d.log.Warn("calls still running after 10s; stopping anyway")
			d.grpc.Stop()
		}
	}
	if d.split != nil {
		// The short paths' calls in flight, on the same terms.
		d.split.Close()
		waited := make(chan struct{})
		go func() { d.split.Wait(); d.frames.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			d.log.Warn("short-path calls still running after 10s; canceling them")
			d.split.Abort()
			d.frames.Abort()
			<-waited
		}
	}
	for i := len(d.onStop) - 1; i >= 0; i-- {
		d.onStop[i]()
	}
	if d.pods != nil {
		d.pods.Close()
	}
	if d.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		d.http.Shutdown(ctx)
		cancel()
	}
	close(d.done)
	d.wg.Wait()
	d.dp.Close()
	return d.st.Close()
}

func (d *Daemon) kickExport() {
	select {
	case d.exportKick <- struct{}{}:
	default:
	}
}

// exportLoop keeps the export table equal to the blocks this node owns.
func (d *Daemon) exportLoop(ctx context.Context) {
	defer d.wg.Done()
	for {
		select {
		case <-d.exportKick:
			d.exportBlocks()
		case <-d.done:
			return
		}
	}
}

func (d *Daemon) exportBlocks() {
	d.exportMu.Lock()
	defer d.exportMu.Unlock()
	if err := d.dp.SetExportedBlocks(d.ipam.ExportedBlocks()); err != nil {
		d.log.Error("export block routes", "err", err)
	}
}

// recoverUnary fails a gRPC call whose handler panics (a bug) with
// Internal, as rpcwire and the CNI binaries' calls do, instead of taking
// skeind down with every call in flight.
func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (_ any, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("a call panicked (a bug: please report it)", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
				err = status.Errorf(codes.Internal, "skeind failed this call on a bug (its log has the details): %v", p)
			}
		}()
		return h(ctx, req)
	}
}

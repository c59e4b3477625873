// Command skeind is skein's node daemon: flags and wiring only; the work is
// in internal/daemon.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/docker"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/internal/logflags"
)

func main() {
	// Plugin sandboxes may re-execute this binary as their init (when
	// skein-sandbox-init is not installed beside it): that process must
	// become the init, not a second daemon. (Importing the package already
	// ensures it; this line says so where a reader looks.)
	sandbox.MaybeRunInit()
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "skeind:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var (
		cfgFile     string
		cfg         daemon.Config
		logLevel    string
		logFormat   string
		defaultPool []string
		gw4, gw6    string
		blockBits   int
		dockerSock  string
		uninstall   bool
		vmf         vmFlags
		kf          kubeFlags
	)
	cmd := &cobra.Command{
		Use:           "skeind",
		Short:         "skein's node daemon: IPAM and routed-veth dataplane behind the CNI binary",
		Version:       daemon.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			final := daemon.Config{}
			if cfgFile != "" {
				var err error
				if final, err = loadConfig(cfgFile); err != nil {
					return err
				}
			}
			// Flags given on the command line win over the file.
			f := cmd.Flags()
			set := func(name string, apply func()) {
				if f.Changed(name) || cfgFile == "" {
					apply()
				}
			}
			set("node", func() { final.Node = cfg.Node })
			set("state-dir", func() { final.StateDir = cfg.StateDir })
			set("socket", func() { final.Socket = cfg.Socket })
			set("volatile-store", func() { final.VolatileStore = cfg.VolatileStore })
			set("metrics-addr", func() { final.MetricsAddr = cfg.MetricsAddr })
			set("mtu", func() { final.Dataplane.MTU = cfg.Dataplane.MTU })
			set("pod-table", func() { final.Dataplane.PodTable = cfg.Dataplane.PodTable })
			set("export-table", func() { final.Dataplane.ExportTable = cfg.Dataplane.ExportTable })
			set("rule-priority", func() { final.Dataplane.RulePriority = cfg.Dataplane.RulePriority })
			set("node-forwarding", func() { final.Dataplane.NodeForwarding = cfg.Dataplane.NodeForwarding })
			set("node-netns", func() { final.Dataplane.NodeNetNS = cfg.Dataplane.NodeNetNS })
			set("routing", func() { final.Routing.Mode = cfg.Routing.Mode })
			set("node-address", func() { final.Routing.NodeAddress = cfg.Routing.NodeAddress })
			set("vxlan-vni", func() { final.Routing.VXLAN.VNI = cfg.Routing.VXLAN.VNI })
			set("vxlan-port", func() { final.Routing.VXLAN.Port = cfg.Routing.VXLAN.Port })
			set("vxlan-mtu", func() { final.Routing.VXLAN.MTU = cfg.Routing.VXLAN.MTU })
			final.ReconcileForce = cfg.ReconcileForce // a flag only
			for name, s := range map[string]struct {
				v   string
				dst *netip.Addr
			}{"gateway-v4": {gw4, &final.Dataplane.GatewayV4}, "gateway-v6": {gw6, &final.Dataplane.GatewayV6}} {
				if f.Changed(name) {
					a, err := netip.ParseAddr(s.v)
					if err != nil {
						return fmt.Errorf("--%s: %w", name, err)
					}
					*s.dst = a
				}
			}
			if len(defaultPool) > 0 {
				final.Pools = append(final.Pools, daemon.PoolSpec{Name: "default", Subnets: defaultPool, BlockSizeBits: blockBits})
			}
			log, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			mode, err := final.Routing.Validate(kf.store == "kubernetes")
			if err != nil {
				return err
			}
			if err := daemon.CheckRoutingTables(mode, final.Dataplane); err != nil {
				return err
			}
			final.Logger = log
			slog.SetDefault(log)
			if uninstall {
				return uninstallNode(final, log)
			}

			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// SIGHUP reloads the pod networks; caught from the start so
			// that an early one does not kill the daemon.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			final.Blocks.MinBlockAge = kf.minBlockAge
			kn, err := kf.openKube(ctx, &final, mode, log)
			if err != nil {
				return err
			}
			if kn == nil {
				cleanLeftovers(ctx, final, log)
			}
			d, err := daemon.New(ctx, final)
			if err != nil {
				if kn != nil {
					final.Store.Close()
					kn.close()
				}
				return err
			}
			if kn != nil {
				// The cache stops after the daemon (which closes the
				// store after its OnStop functions).
				defer kn.cache.stop()
				kn.routing.run(ctx)
				d.OnStop(kn.routing.stop)
				if kn.egress != nil {
					d.OnStop(kn.egress.Close)
				}
			}
			if err := vmf.serve(ctx, d, final.Socket); err != nil {
				d.Close()
				return err
			}
			if dockerSock != "off" {
				if err := serveDocker(d, dockerSock, final.Dataplane.MTU); err != nil {
					d.Close()
					return err
				}
			}
			go reloadOnHUP(ctx, hup, d, cfgFile, log)
			return d.Serve(ctx)
		},
	}
	f := cmd.Flags()
	vmf.register(f)
	f.StringVar(&cfgFile, "config", "", "JSON configuration file (flags given explicitly override it)")
	f.StringVar(&cfg.Node, "node", "", "node name (default: host name)")
	f.StringVar(&cfg.StateDir, "state-dir", daemon.DefaultStateDir, "directory of the embedded store")
	f.StringVar(&cfg.Socket, "socket", daemon.DefaultSocket, "gRPC socket for the CNI binary and skeinctl")
	f.StringVar(&cfg.VolatileStore, "volatile-store", "", "file of the CNI attachment records, which a reboot voids and which are written without a sync; best on a tmpfs (empty: beside --socket, <socket without .sock>-attachments.db)")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", daemon.DefaultMetricsAddr, "loopback address for /metrics and /healthz, or \"off\"")
	f.IntVar(&cfg.Dataplane.MTU, "mtu", 0, "pod interface MTU (0: the node uplink's)")
	f.IntVar(&cfg.Dataplane.PodTable, "pod-table", 116, "routing table of per-pod host routes")
	f.IntVar(&cfg.Dataplane.ExportTable, "export-table", 119, "routing table of exported block routes")
	f.IntVar(&cfg.Dataplane.RulePriority, "rule-priority", 2000, "priority of the ip rule that looks up the pod table")
	f.BoolVar(&cfg.Dataplane.NodeForwarding, "node-forwarding", defaultNodeForwarding, "enable IPv4 and IPv6 forwarding in the node's namespace")
	f.StringVar(&cfg.Dataplane.NodeNetNS, "node-netns", "", "path of the node's network namespace when skeind runs outside it (tests, tools); empty: skeind's own")
	f.StringVar(&gw4, "gateway-v4", "169.254.1.1", "IPv4 gateway pods route through")
	f.StringVar(&gw6, "gateway-v6", "fe80::1", "IPv6 gateway of attachments made before each pod routed through its host veth's own link-local address")
	f.StringSliceVar(&defaultPool, "default-pool", nil, "create the \"default\" pool with these subnets if it does not exist (e.g. 10.64.0.0/16,fd00:64::/112)")
	f.IntVar(&blockBits, "default-pool-block-bits", 0, "blockSizeBits of the default pool created by --default-pool (0: 5)")
	f.StringVar(&dockerSock, "docker-socket", docker.DefaultSocket, "socket of the Docker network and IPAM plugin (driver name: its base name without .sock), or \"off\"")
	f.BoolVar(&uninstall, "uninstall", false, "remove what skeind keeps in the node's namespace when it stops (its routes, rules, VXLAN device, nftables guard) and exit; pods' attachments are left alone: run it once no pod of skein's is left, before another CNI takes the node over (--node-netns, --pod-table, --export-table, --rule-priority, --vxlan-* as skeind ran with)")
	f.BoolVar(&cfg.ReconcileForce, "reconcile-force", false, "at start, delete host links the store cannot account for (skeind refuses to start otherwise: see the log); for once, after checking the store is the right one")
	f.StringVar(&cfg.Routing.Mode, "routing", "export", "how pods reach other nodes' pods: export (the node's blocks go to --export-table for a routing daemon such as BIRD to announce), "+
		"direct (a route to every other node's blocks via that node's address; nodes on one L2 segment), or vxlan (an overlay: a VXLAN device, a route per remote block through it; nodes anywhere on IP). direct and vxlan need --store kubernetes; their routes go to table 120 (protocol 32, looked up at rule priority 2001), applied on every change of the cluster's blocks and nodes (only the blocks it touches) and synced in full every 30 s, and kept when skeind stops. A block's routes lead to the node in its nodeName (the skein.dev/node label only for blocks without one). "+
		"Switching to export removes them at start. See skeinctl route list")
	f.StringVar(&cfg.Routing.NodeAddress, "node-address", "", "this node's underlay addresses for direct and vxlan routing, comma separated, at most one per family (e.g. 192.0.2.10,2001:db8::10); "+
		"skeind writes them on its Node as the annotation skein.dev/node-address, which peers prefer to the Node's InternalIPs. Empty: the annotation as it is, else the InternalIPs. In vxlan mode the tunnel's underlay is the IPv4 address if there is one, else the IPv6 one, on every node alike (give only an IPv6 address for an IPv6 underlay)")
	f.IntVar(&cfg.Routing.VXLAN.VNI, "vxlan-vni", 0, "VXLAN network identifier of --routing vxlan, 1..16777215, the same on every node (0: 4100)")
	f.IntVar(&cfg.Routing.VXLAN.Port, "vxlan-port", 0, "UDP port of --routing vxlan, 1..65535, the same on every node (0: 4789)")
	f.IntVar(&cfg.Routing.VXLAN.MTU, "vxlan-mtu", 0, "MTU of the VXLAN device of --routing vxlan, 1280..65535 (0: the underlay link's MTU minus 50 on an IPv4 underlay, 70 on IPv6); with --mtu 0 pods get this MTU")
	f.StringVar(&kf.store, "store", "embedded", "where pools and blocks live: embedded (a file under --state-dir, one host) or kubernetes (the API server; attachments stay in the file)")
	f.StringVar(&kf.kubeconfig, "kubeconfig", "", "kubeconfig for --store kubernetes (empty: the in-cluster configuration)")
	f.DurationVar(&kf.grantTimeout, "block-wait", kubestore.DefaultGrantTimeout, "with --store kubernetes, how long one block claim (the create of an AddressBlock) may take before the ADD that needs it fails with \"try again\" (CNI code 11); spare blocks are claimed ahead, so ADDs rarely wait for one")
	f.StringVar(&kf.leaseNamespace, "lease-namespace", kubestore.DefaultLeaseNamespace, "with --store kubernetes, the namespace of this node's liveness Lease (skein-node-<node>), renewed every quarter of --lease-duration: skein-controller takes the blocks of a deleted Node only once it has expired")
	f.DurationVar(&kf.leaseDuration, "lease-duration", kubestore.DefaultLeaseDuration, "with --store kubernetes, the duration of this node's liveness Lease (whole seconds; renewed every quarter of it)")
	f.DurationVar(&kf.minBlockAge, "block-min-age", 30*time.Second, "with --store kubernetes, how long a block stays empty before it is given back to the cluster (one spare block per pool in use is always kept)")
	f.BoolVar(&kf.egress, "egress", true, "with --store kubernetes, give pods annotated egress.skein.dev/<namespace>: <egress>,… their tunnels to those Egresses' gateways (needs the Egress CRD, and get/list/watch of Pods, Services and Egresses)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

// defaultNodeForwarding is skeind's default for --node-forwarding and for
// a configuration file without dataplane.nodeForwarding: one default
// whichever way skeind is configured. On: skeind routes for its pods, and
// IPv6 pod traffic needs node-wide forwarding on kernels before 6.17 (see
// internal/dataplane). (dataplane.Config's own zero value stays off for
// other users of the package.)
const defaultNodeForwarding = true

// loadConfig reads a JSON configuration file; unknown fields are errors, so
// a misspelt setting is not silently ignored. Settings the file leaves out
// get skeind's defaults, the same as the flags'.
func loadConfig(path string) (daemon.Config, error) {
	var c daemon.Config
	c.Dataplane.NodeForwarding = defaultNodeForwarding
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config file: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("config file %s: %w", path, err)
	}
	// Decode reads one JSON value; anything after it is a mistake too
	// (two documents, a stray bracket), not something to ignore.
	end := dec.InputOffset()
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("config file %s: unexpected data after the JSON object that ends at byte %d", path, end)
	}
	return c, nil
}

// reloadOnHUP re-reads the config file on every SIGHUP and applies its pod
// networks; a file that does not load or networks that do not validate are
// logged and the running ones kept. (The rest of the file needs a restart.)
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, d *daemon.Daemon, cfgFile string, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if cfgFile == "" {
			log.Warn("SIGHUP: no --config file to reload")
			continue
		}
		c, err := loadConfig(cfgFile)
		if err == nil {
			err = d.ReloadPodNetworks(c)
		}
		if err != nil {
			log.Error("SIGHUP: pod networks not reloaded; the running ones stay", "config", cfgFile, "err", err)
		}
	}
}

// serveDocker starts the Docker front door on the daemon's store, IPAM and
// dataplane; it stops with the daemon.
func serveDocker(d *daemon.Daemon, socket string, mtu int) error {
	drv, err := docker.New(docker.Options{
		Store:     d.Store(),
		IPAM:      d.IPAM(),
		Dataplane: d.Dataplane(),
		MTU:       mtu,
		Logger:    d.Logger(),
		Observe: func(method string, code uint, took time.Duration) {
			d.Observe("docker", method, code, took)
		},
	})
	if err != nil {
		return err
	}
	srv, err := docker.Listen(drv, socket)
	if err != nil {
		return err
	}
	d.OnStop(srv.Close)
	return nil
}

func newLogger(level, format string) (*slog.Logger, error) {
	return logflags.New(level, format, os.Stderr)
}

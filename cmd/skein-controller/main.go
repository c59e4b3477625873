// Command skein-controller runs skein's cluster-wide reconcilers (pool
// status and finalizers, Egress gateways, garbage collection of nodes gone
// for good) in a controller-runtime manager, one replica at a time through
// leader election on a Lease, and serves the AddressPool webhook on every
// replica. It is not in the path of a block grant: nodes claim their
// blocks themselves. Flags and wiring only, the work is in
// internal/controller.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/skeinnet/skein/internal/egresscontroller"

	"github.com/skeinnet/skein/internal/kubeclient"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/controller"
	"github.com/skeinnet/skein/internal/logflags"
	"github.com/skeinnet/skein/internal/webhook"
)

// buildVersion is set by the Makefile's -ldflags.
var buildVersion = "dev"

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "skein-controller:", err)
		os.Exit(1)
	}
}

// flags are the command line.
type flags struct {
	kubeconfig  string
	metricsAddr string
	healthAddr  string
	gcInterval  time.Duration
	gcGrace     time.Duration
	nodeLeaseNS string
	poolStatus  time.Duration
	egressImage string
	logLevel    string
	logFormat   string
	qps         float32
	burst       int

	leaderElect   bool
	leaseNS       string
	leaseName     string
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration

	webhook webhook.Options
}

func newCommand() *cobra.Command {
	var fl flags
	cmd := &cobra.Command{
		Use:           "skein-controller",
		Short:         "skein's cluster controller: keeps pool status, runs Egress gateways, collects what nodes gone for good leave",
		Version:       buildVersion,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, fl)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means the in-cluster configuration")
	f.StringVar(&fl.metricsAddr, "metrics-addr", ":9386", `address of the Prometheus metrics endpoint (/metrics); "0" turns it off`)
	f.StringVar(&fl.healthAddr, "health-addr", ":9387", `address of the probes (/healthz, /readyz); "0" turns them off`)
	f.DurationVar(&fl.gcInterval, "gc-interval", controller.DefaultGCInterval, "time between sweeps for blocks, Leases and BlockRequests of nodes gone for good")
	f.DurationVar(&fl.gcGrace, "node-gc-grace", controller.DefaultNodeGCGrace,
		"how long past the end of its liveness Lease a node whose Node is deleted keeps its blocks")
	f.StringVar(&fl.nodeLeaseNS, "lease-namespace", "",
		"namespace of the nodes' liveness Leases (skeind's --lease-namespace); empty means the controller's own (in a cluster), else "+controller.DefaultLeaseNamespace)
	f.DurationVar(&fl.poolStatus, "pool-status-interval", controller.DefaultPoolStatusInterval,
		"least time between two status writes of one AddressPool (block events are counted together)")
	f.StringVar(&fl.egressImage, "egress-image", egresscontroller.DefaultImage, "image of Egress router pods (runs skein-egress)")
	f.Float32Var(&fl.qps, "kube-api-qps", 100, "requests per second to the API server, sustained (client-side limit)")
	f.IntVar(&fl.burst, "kube-api-burst", 200, "requests to the API server in a burst above --kube-api-qps")
	f.StringVar(&fl.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&fl.logFormat, "log-format", "text", "text or json")
	f.BoolVar(&fl.leaderElect, "leader-elect", true, "run only while holding the Lease, so that one replica of several works at a time")
	f.StringVar(&fl.leaseNS, "leader-elect-namespace", "", "namespace of the Lease; empty means the controller's own (in a cluster)")
	f.StringVar(&fl.leaseName, "leader-elect-name", "skein-controller", "name of the Lease")
	f.DurationVar(&fl.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a Lease not renewed holds off the other replicas")
	f.DurationVar(&fl.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew before it steps down")
	f.DurationVar(&fl.retryPeriod, "leader-elect-retry-period", 2*time.Second, "time between attempts to take or renew the Lease")
	f.IntVar(&fl.webhook.Port, "webhook-port", webhook.DefaultPort, "port of the AddressPool validating webhook (TLS); 0 turns the webhook off")
	f.StringVar(&fl.webhook.Host, "webhook-bind-address", "0.0.0.0", "address the webhook listens on")
	f.StringVar(&fl.webhook.Namespace, "webhook-namespace", "", "namespace of the webhook's Service and certificate Secret; empty means the controller's own (in a cluster), else "+webhook.DefaultNamespace)
	f.StringVar(&fl.webhook.ServiceName, "webhook-service", webhook.DefaultServiceName, "name of the Service in front of the webhook (its certificate is made for it)")
	f.StringVar(&fl.webhook.ConfigName, "webhook-config", webhook.DefaultConfigName, "ValidatingWebhookConfiguration whose caBundle the controller keeps current")
	f.StringVar(&fl.webhook.SecretName, "webhook-secret", webhook.DefaultSecretName, "Secret holding the webhook's CA and serving certificate, shared by the replicas")
	f.DurationVar(&fl.webhook.Validity, "webhook-cert-validity", webhook.DefaultValidity, "validity of each serving certificate; rotated when a third is left")
	return cmd
}

// check refuses flag values the manager would take badly or silently.
func (fl flags) check() error {
	if fl.qps <= 0 || fl.burst <= 0 {
		return fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d: both must be positive", fl.qps, fl.burst)
	}
	if fl.gcInterval <= 0 {
		return fmt.Errorf("--gc-interval %v: must be positive", fl.gcInterval)
	}
	if fl.gcGrace <= 0 {
		return fmt.Errorf("--node-gc-grace %v: must be positive", fl.gcGrace)
	}
	if fl.poolStatus <= 0 {
		return fmt.Errorf("--pool-status-interval %v: must be positive", fl.poolStatus)
	}
	if !fl.leaderElect {
		return nil
	}
	if fl.leaseName == "" {
		return errors.New("--leader-elect-name is empty")
	}
	if fl.retryPeriod <= 0 || fl.renewDeadline <= fl.retryPeriod || fl.leaseDuration <= fl.renewDeadline {
		return fmt.Errorf("lease timings must satisfy 0 < retry period (%v) < renew deadline (%v) < lease duration (%v)",
			fl.retryPeriod, fl.renewDeadline, fl.leaseDuration)
	}
	return nil
}

func run(ctx context.Context, fl flags) error {
	if err := fl.check(); err != nil {
		return err
	}
	logger, err := newLogger(fl.logLevel, fl.logFormat)
	if err != nil {
		return err
	}
	ctrl.SetLogger(logger)

	cfg, err := kubeclient.Config(fl.kubeconfig, "skein-controller")
	if err != nil {
		return err
	}
	// controller-runtime's default (20/s) paces a failover's catch-up
	// (Egress Deployments, the blocks of a node gone for good).
	cfg.QPS, cfg.Burst = fl.qps, fl.burst
	mgr, err := ctrl.NewManager(cfg, managerOptions(fl))
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	leaseNS := fl.nodeLeaseNS
	if leaseNS == "" {
		leaseNS = ownNamespace() // "" outside a cluster: the default
	}
	if err := controller.Setup(mgr, controller.Options{
		GCInterval: fl.gcInterval, NodeGCGrace: fl.gcGrace, LeaseNamespace: leaseNS,
		PoolStatusInterval: fl.poolStatus, EgressImage: fl.egressImage,
	}); err != nil {
		return err
	}
	if err := setupWebhook(mgr, fl.webhook); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add ready check: %w", err)
	}
	logger.Info("starting", "version", buildVersion, "leaderElection", fl.leaderElect, "lease", fl.leaseNS+"/"+fl.leaseName,
		"nodeLeases", cmp.Or(leaseNS, controller.DefaultLeaseNamespace), "nodeGCGrace", fl.gcGrace)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// setupWebhook adds the AddressPool validating webhook (internal/webhook)
// to the manager: it serves on every replica, leader or not, since the API
// server may call any of them behind the Service, and it makes, shares
// (through a Secret) and rotates its own serving certificate, patching the
// caBundle of the webhook configuration. Port 0 leaves it out.
func setupWebhook(mgr manager.Manager, opts webhook.Options) error {
	if opts.Port == 0 {
		return nil
	}
	if opts.Namespace == "" {
		opts.Namespace = ownNamespace()
	}
	if err := webhook.Add(mgr, opts); err != nil {
		return fmt.Errorf("set up the validating webhook: %w", err)
	}
	return nil
}

// ownNamespace is the pod's namespace, from its service account; outside a
// cluster, empty (the webhook's default applies).
func ownNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// scheme knows the built-in kinds (Node, Lease, Event) and skein.dev.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(skeinv1.AddToScheme(s))
	return s
}

func managerOptions(fl flags) ctrl.Options {
	return ctrl.Options{
		Scheme:                 scheme(),
		Metrics:                metricsserver.Options{BindAddress: fl.metricsAddr},
		HealthProbeBindAddress: fl.healthAddr,
		LeaderElection:         fl.leaderElect,
		LeaderElectionID:       fl.leaseName,
		// Empty: the namespace of the pod, read from its service account.
		LeaderElectionNamespace: fl.leaseNS,
		// A replica told to stop gives the Lease up at once, so the next
		// takes over without waiting for it to expire. Safe: the process
		// ends right after.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &fl.leaseDuration,
		RenewDeadline:                 &fl.renewDeadline,
		RetryPeriod:                   &fl.retryPeriod,
	}
}

func newLogger(level, format string) (logr.Logger, error) {
	h, err := logflags.Handler(level, format, os.Stderr)
	if err != nil {
		return logr.Logger{}, err
	}
	return logr.FromSlogHandler(h), nil
}

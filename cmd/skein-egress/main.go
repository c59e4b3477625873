// Command skein-egress runs in each router pod of an Egress: it follows
// the Egress and its client pods through the API server and keeps the
// router's data plane (Foo-over-UDP tunnels to the clients, SNAT towards
// the destinations; internal/egress) in step, serving metrics and probes.
// Flags and wiring only: the work is in internal/egress/router.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/skeinnet/skein/internal/kubeclient"

	"github.com/spf13/cobra"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/egress/router"
	"github.com/skeinnet/skein/internal/logflags"
)

// buildVersion is set by the Makefile's -ldflags.
var buildVersion = "dev"

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "skein-egress:", err)
		os.Exit(1)
	}
}

type flags struct {
	name, namespace string
	port            int
	outInterface    string
	metricsAddr     string
	kubeconfig      string
	netns           string
	coalesce        time.Duration
	resync          time.Duration
	logLevel        string
	logFormat       string
}

func newCommand() *cobra.Command {
	var fl flags
	cmd := &cobra.Command{
		Use:           "skein-egress",
		Short:         "an Egress router: tunnels from the Egress's client pods, SNAT to its destinations",
		Version:       buildVersion,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, fl, openDataplane)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.name, "egress-name", "", "name of the Egress this router serves (required)")
	f.StringVar(&fl.namespace, "egress-namespace", "", "namespace of the Egress (required)")
	f.IntVar(&fl.port, "port", skeinv1.EgressFoUPort, "UDP port of the Foo-over-UDP tunnels (the Egress Service's port)")
	f.StringVar(&fl.outInterface, "out-interface", "eth0", "interface SNAT'd traffic leaves by")
	f.StringVar(&fl.metricsAddr, "metrics-addr", ":9386", "address of /metrics, /healthz and /readyz")
	f.StringVar(&fl.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means the in-cluster configuration")
	f.StringVar(&fl.netns, "netns", "", "network namespace to program (a path such as /run/netns/x); empty means skein-egress's own, as in a router pod")
	f.DurationVar(&fl.coalesce, "coalesce", 20*time.Millisecond, "how long a change of the client pods waits for more before the data plane is synced")
	f.DurationVar(&fl.resync, "resync", time.Minute, "time between syncs of the whole client set when nothing changed")
	f.StringVar(&fl.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&fl.logFormat, "log-format", "text", "text or json")
	return cmd
}

// check refuses flag values that cannot work.
func (fl flags) check() error {
	if fl.name == "" || fl.namespace == "" {
		return errors.New("--egress-name and --egress-namespace are required")
	}
	if fl.port <= 0 || fl.port > 65535 {
		return fmt.Errorf("--port %d: not a UDP port", fl.port)
	}
	if fl.outInterface == "" {
		return errors.New("--out-interface is empty")
	}
	if fl.coalesce < 0 || fl.resync <= 0 {
		return fmt.Errorf("--coalesce %v and --resync %v: want a coalesce of 0 or more and a positive resync", fl.coalesce, fl.resync)
	}
	return nil
}

func run(ctx context.Context, fl flags, open router.Opener) error {
	if err := fl.check(); err != nil {
		return err
	}
	log, err := newLogger(fl.logLevel, fl.logFormat)
	if err != nil {
		return err
	}
	local4, local6, err := localAddrs(os.Getenv, fl)
	if err != nil {
		return err
	}
	cfg, err := kubeclient.Config(fl.kubeconfig, "skein-egress")
	if err != nil {
		return err
	}
	a, err := router.New(router.Options{
		Config: cfg, Namespace: fl.namespace, Name: fl.name, Open: open, Log: log,
		Coalesce: fl.coalesce, Resync: fl.resync,
		Dataplane: router.DataplaneConfig{
			NetNS: fl.netns, Port: fl.port, Local4: local4, Local6: local6, OutInterface: fl.outInterface,
		},
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", fl.metricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx) //nolint:errcheck // best effort on the way out
	}()
	log.Info("starting", "version", buildVersion, "egress", fl.namespace+"/"+fl.name,
		"local4", local4, "local6", local6, "metrics", ln.Addr().String())
	if err := a.Run(ctx); err != nil {
		return err
	}
	log.Info("stopped; data plane removed")
	return nil
}

// localAddrs returns the router pod's own addresses: $POD_IPS (the
// downward API's status.podIPs, comma separated), else $POD_IP, else the
// global addresses of --out-interface.
func localAddrs(getenv func(string) string, fl flags) (v4, v6 netip.Addr, err error) {
	src := "POD_IPS"
	list := getenv("POD_IPS")
	if strings.TrimSpace(list) == "" {
		src, list = "POD_IP", getenv("POD_IP")
	}
	var addrs []netip.Addr
	if strings.TrimSpace(list) != "" {
		for _, s := range strings.Split(list, ",") {
			a, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				return v4, v6, fmt.Errorf("$%s %q: %w", src, list, err)
			}
			addrs = append(addrs, a.Unmap())
		}
	} else {
		src = "interface " + fl.outInterface
		if addrs, err = interfaceAddrs(fl.netns, fl.outInterface); err != nil {
			return v4, v6, fmt.Errorf("the router's own addresses (set $POD_IPS or $POD_IP): %w", err)
		}
	}
	for _, a := range addrs {
		switch {
		case a.Is4() && !v4.IsValid():
			v4 = a
		case a.Is6() && !v6.IsValid():
			v6 = a
		}
	}
	if !v4.IsValid() && !v6.IsValid() {
		return v4, v6, fmt.Errorf("no address of the router in %s", src)
	}
	return v4, v6, nil
}

func newLogger(level, format string) (*slog.Logger, error) {
	return logflags.New(level, format, os.Stderr)
}

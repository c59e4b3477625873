package main

import (
	"context"
	"errors"
	"log/slog"

	"k8s.io/client-go/rest"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/internal/podegress"
	"github.com/skeinnet/skein/internal/routing"
)

// errNoEgressDataplane: this build has no egress data plane yet.
var errNoEgressDataplane = errors.New("the egress data plane (Foo-over-UDP tunnels) is not built into this skeind")

// applyEgress is the kernel side of pods' egress tunnels. It becomes
// egress.ApplyClient once the data plane is merged (a one-line change);
// until then, pods naming an Egress fail their ADD with a clear error and
// pods naming none are unaffected.
func applyEgress(netnsPath string, cfg egress.ClientConfig) error {
	if len(cfg.Gateways) == 0 {
		return nil // nothing was ever made
	}
	return errNoEgressDataplane
}

// startEgress follows the egress annotations of this node's pods
// (Kubernetes mode); it becomes cfg.PodHook. Close it when skeind stops.
func startEgress(ctx context.Context, cfg *daemon.Config, rc *rest.Config, events *routing.NodeEvents, log *slog.Logger) (*podegress.Client, error) {
	o := podegress.Options{
		Config:      rc,
		Node:        cfg.Node,
		Applier:     podegress.ApplierFunc(applyEgress),
		Attachments: cfg.Store.ListAttachments,
		Logger:      log,
	}
	if events != nil {
		o.Events = events
	}
	c, err := podegress.New(ctx, o)
	if err != nil {
		return nil, err
	}
	cfg.PodHook = c
	return c, nil
}

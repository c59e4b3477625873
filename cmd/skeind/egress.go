package main

import (
	"context"
	"log/slog"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/internal/podegress"
	"github.com/skeinnet/skein/internal/routing"
)

// applyEgress is the kernel side of pods' egress tunnels: the data plane
// library's ApplyClient (the zero config removes what it made).
func applyEgress(netnsPath string, cfg egress.ClientConfig) error {
	return egress.ApplyClient(netnsPath, cfg)
}

// startEgress follows the egress annotations of this node's pods
// (Kubernetes mode), reading the shared cache c; it becomes cfg.PodHook.
// Close it when skeind stops.
func startEgress(ctx context.Context, cfg *daemon.Config, rc *rest.Config, c cache.Cache, events *routing.NodeEvents, log *slog.Logger) (*podegress.Client, error) {
	o := podegress.Options{
		Config:      rc,
		Cache:       c,
		Node:        cfg.Node,
		Applier:     podegress.ApplierFunc(applyEgress),
		Attachments: cfg.Store.ListAttachments,
		Logger:      log,
	}
	if events != nil {
		o.Events = events
	}
	pe, err := podegress.New(ctx, o)
	if err != nil {
		return nil, err
	}
	cfg.PodHook = pe
	return pe, nil
}

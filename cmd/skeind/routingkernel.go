package main

import (
	"context"
	"net/netip"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/routing"
)

// openKernel opens the kernel side of routing for mode, and returns the
// VXLAN device's MTU in vxlan mode (0 otherwise).
// TODO(route-kube): routing.NewKernel once the kernel side is on main.
func openKernel(mode routing.Mode, cfg daemon.Config, local []netip.Addr) (routingKernel, int, error) {
	return noKernel{}, 0, nil
}

type noKernel struct{}

func (noKernel) Sync(_ context.Context, rs []routing.Remote) ([]routing.Status, error) {
	out := make([]routing.Status, len(rs))
	for i, r := range rs {
		out[i] = routing.Status{Remote: r, Reason: "kernel side not built yet"}
	}
	return out, nil
}

func (noKernel) Close() error { return nil }

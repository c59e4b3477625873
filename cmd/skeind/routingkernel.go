package main

import (
	"net/netip"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
)

// openKernel opens the kernel side of routing for mode in the node's
// namespace, and returns the MTU pods need for traffic to other nodes (the
// VXLAN device's in vxlan mode; 0 in the others). It changes nothing in
// the kernel.
func openKernel(mode routing.Mode, cfg daemon.Config, local []netip.Addr) (routingKernel, int, error) {
	k, err := kernel.NewKernel(kernel.KernelConfig{
		Mode:       mode,
		NodeNetNS:  cfg.Dataplane.NodeNetNS,
		LocalAddrs: local,
		VXLAN: kernel.VXLANConfig{
			VNI:  cfg.Routing.VXLAN.VNI,
			Port: cfg.Routing.VXLAN.Port,
			MTU:  cfg.Routing.VXLAN.MTU,
		},
	})
	if err != nil {
		return nil, 0, err
	}
	mtu, err := k.PodMTU()
	if err != nil {
		k.Close()
		return nil, 0, err
	}
	return k, mtu, nil
}

var _ routingKernel = (*kernel.Kernel)(nil)

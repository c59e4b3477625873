package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/routing/kernel"
)

// uninstallNode removes what skeind made in the node's network namespace
// and keeps when it stops (--uninstall): the routing of every mode (table
// 120's routes, its rule, the VXLAN device and its nftables guard) and
// the dataplane's rules, gateway address and exported block routes. Pods'
// attachments are not touched: run it once no pod of skein's is left
// (after the DaemonSet is deleted), before another CNI takes the node
// over, whose routes table 120 would otherwise shadow.
func uninstallNode(cfg daemon.Config, log *slog.Logger) error {
	var errs []error
	k, err := kernel.NewKernel(kernel.KernelConfig{
		Mode:      routing.ModeExport, // Uninstall removes every mode's state
		NodeNetNS: cfg.Dataplane.NodeNetNS,
		VXLAN:     kernel.VXLANConfig{VNI: cfg.Routing.VXLAN.VNI, Port: cfg.Routing.VXLAN.Port, MTU: cfg.Routing.VXLAN.MTU},
	})
	if err == nil {
		err = k.Uninstall()
		k.Close()
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("routing: %w", err))
	}
	dp, err := dataplane.New(cfg.Dataplane)
	if err == nil {
		err = dp.Uninstall()
		dp.Close()
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("dataplane: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	log.Info("uninstalled: skein's routes, rules, VXLAN device and nftables guard are gone from the node's namespace")
	return nil
}

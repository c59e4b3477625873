package daemon

import (
	"context"
	"fmt"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/routing"
)

// RoutingConfig is routing between nodes (skeind --routing and friends;
// the configuration file's "routing" section). Zero values are documented
// per field.
type RoutingConfig struct {
	// Mode: export (""), direct or vxlan; direct and vxlan need the
	// Kubernetes store (they route other nodes' AddressBlocks).
	Mode string `json:"mode,omitempty"`
	// NodeAddress is this node's underlay addresses, comma separated, at
	// most one per family; skeind writes it on its Node object
	// (skein.dev/node-address) for peers. "" = the Node's annotation, else
	// its InternalIPs.
	NodeAddress string `json:"nodeAddress,omitempty"`
	// VXLAN settings, for Mode vxlan only.
	VXLAN VXLANConfig `json:"vxlan"`
}

// VXLANConfig configures the VXLAN device. Zero values are the defaults.
type VXLANConfig struct {
	// VNI: 1..16777215; 0 = routing.DefaultVXLANVNI (4100).
	VNI int `json:"vni,omitempty"`
	// Port is the UDP port: 1..65535; 0 = routing.DefaultVXLANPort (4789).
	Port int `json:"port,omitempty"`
	// MTU of the device: 1280..65535; 0 = the underlay link's MTU minus
	// the VXLAN overhead (50 bytes on IPv4, 70 on IPv6). With the pod MTU
	// (--mtu) 0, pods get the device's MTU.
	MTU int `json:"mtu,omitempty"`
}

// Validate checks c without touching anything; kubernetes says whether
// the store is the API server.
func (c RoutingConfig) Validate(kubernetes bool) (routing.Mode, error) {
	mode, err := routing.ParseMode(c.Mode)
	if err != nil {
		return "", fmt.Errorf("--routing: %w", err)
	}
	if mode != routing.ModeExport && !kubernetes {
		return "", fmt.Errorf("--routing %s needs --store kubernetes (it routes the AddressBlocks of the other nodes, which only the API server knows)", mode)
	}
	if c.NodeAddress != "" {
		if !kubernetes {
			return "", fmt.Errorf("--node-address needs --store kubernetes (it is published on the node's Node object)")
		}
		if _, err := routing.ParseNodeAddresses(c.NodeAddress); err != nil {
			return "", fmt.Errorf("--node-address: %w", err)
		}
	}
	v := c.VXLAN
	for _, f := range []struct {
		name     string
		val      int
		min, max int
	}{
		{"--vxlan-vni", v.VNI, 1, 1<<24 - 1},
		{"--vxlan-port", v.Port, 1, 65535},
		{"--vxlan-mtu", v.MTU, 1280, 65535},
	} {
		if f.val == 0 {
			continue
		}
		if mode != routing.ModeVXLAN {
			return "", fmt.Errorf("%s needs --routing vxlan", f.name)
		}
		if f.val < f.min || f.val > f.max {
			return "", fmt.Errorf("%s %d: want %d..%d (0: the default)", f.name, f.val, f.min, f.max)
		}
	}
	return mode, nil
}

// CheckRoutingTables refuses dataplane settings that collide with the
// routing of mode (direct and vxlan: table routing.DefaultTable, looked up
// at rule priority routing.DefaultRulePriority): a pod or export table of
// that number would mix the dataplane's routes with routing's, and a pod
// table looked up at or after routing's rule would let other nodes'
// blocks shadow this node's pods.
func CheckRoutingTables(mode routing.Mode, dp dataplane.Config) error {
	if mode == routing.ModeExport {
		return nil
	}
	switch {
	case dp.PodTable == routing.DefaultTable:
		return fmt.Errorf("--pod-table %d is the table --routing %s installs other nodes' blocks in", dp.PodTable, mode)
	case dp.ExportTable == routing.DefaultTable:
		return fmt.Errorf("--export-table %d is the table --routing %s installs other nodes' blocks in", dp.ExportTable, mode)
	case dp.RulePriority >= routing.DefaultRulePriority:
		return fmt.Errorf("--rule-priority %d: with --routing %s the pod table must be looked up before other nodes' blocks (priority %d)", dp.RulePriority, mode, routing.DefaultRulePriority)
	}
	return nil
}

// Routes reports this node's routes to other nodes' blocks
// (*routing.Loop).
type Routes interface {
	// Mode is the routing mode.
	Mode() routing.Mode
	// Statuses are the last sync's, sorted by block; synced is false
	// before the first sync.
	Statuses() (st []routing.Status, synced bool)
	// SyncNow syncs at once. ListRoutes calls it in export mode, where a
	// routing daemon (BIRD) installs the routes on its own schedule and the
	// last sync's statuses may be up to a resync period old.
	SyncNow(ctx context.Context) error
}

var _ Routes = (*routing.Loop)(nil)

// ListRoutes lists the routes to other nodes' blocks; without Routes
// (the embedded store) the list is empty, with the configured mode.
func (s *adminServer) ListRoutes(ctx context.Context, _ *rpc.Empty) (*rpc.RouteList, error) {
	r := s.d.cfg.Routes
	if r == nil {
		mode, err := routing.ParseMode(s.d.cfg.Routing.Mode)
		if err != nil {
			mode = routing.Mode(s.d.cfg.Routing.Mode)
		}
		return &rpc.RouteList{Mode: string(mode), Synced: true}, nil
	}
	if r.Mode() == routing.ModeExport {
		// An export-mode sync only reads the kernel (and removes other
		// modes' leftovers, of which there are none after the first).
		if err := r.SyncNow(ctx); err != nil {
			s.d.log.Warn("route list: fresh sync failed; reporting the last one", "err", err)
		}
	}
	st, synced := r.Statuses()
	out := &rpc.RouteList{Mode: string(r.Mode()), Synced: synced, Routes: make([]*rpc.Route, 0, len(st))}
	for _, s := range st {
		m := &rpc.Route{Block: s.Block.String(), Name: s.Name, Node: s.Node, Mode: out.Mode, Installed: s.Installed, Reason: s.Reason}
		for _, a := range s.NodeAddrs {
			m.NodeAddresses = append(m.NodeAddresses, a.String())
		}
		if s.Via.IsValid() {
			m.Via = s.Via.String()
		}
		out.Routes = append(out.Routes, m)
	}
	return out, nil
}

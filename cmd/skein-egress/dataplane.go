package main

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/internal/egress/router"
	"github.com/skeinnet/skein/internal/netns"
)

// openDataplane opens internal/egress's Router in the configured
// namespace (it also sets the sysctls a router needs there: forwarding
// on, rp_filter off). DataplaneConfig has RouterConfig's fields.
func openDataplane(cfg router.DataplaneConfig) (router.Dataplane, error) {
	r, err := egress.NewRouter(egress.RouterConfig(cfg))
	if err != nil {
		return nil, err
	}
	return routerAdapter{r}, nil
}

// routerAdapter gives the Router's statistics the agent's type.
type routerAdapter struct{ *egress.Router }

func (a routerAdapter) Stats() (router.Stats, error) {
	s, err := a.Router.Stats()
	return router.Stats{Tunnels: s.Tunnels, Peers: s.Peers, ConntrackEntries: s.ConntrackEntries,
		Packets: s.Packets, Bytes: s.Bytes, NATConnections: s.NATConnections,
		DroppedSource: s.DroppedSource, DroppedDestination: s.DroppedDestination}, err
}

// interfaceAddrs returns the global unicast addresses of dev in the
// namespace at path ("" = the current one).
func interfaceAddrs(path, dev string) ([]netip.Addr, error) {
	var out []netip.Addr
	read := func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("find interface %s: %w", dev, err)
		}
		list, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("addresses of %s: %w", dev, err)
		}
		for _, a := range list {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
		return nil
	}
	if path == "" {
		return out, read()
	}
	return out, netns.Do(path, read)
}

package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Found is one skein-owned host veth found by Scan.
type Found struct {
	HostName  string
	Alias     string
	HostIndex int
	Addrs     []netip.Addr // from PodTable routes (tagged PodRouteProto) via this link
}

// dumpRetries bounds how often Scan repeats a dump the kernel reports as
// interrupted by a concurrent change.
const dumpRetries = 5

// Scan returns every host link skein owns (alias starting with AliasPrefix,
// or an untagged veth named like skein's host links: see owned), with the
// pod addresses routed to it, from one link dump and one PodTable route dump
// (both families). Order follows the kernel's link order. A dump interrupted
// by concurrent changes is retried whole.
func (d *Dataplane) Scan() (_ []Found, retErr error) {
	defer wrap(&retErr, "scan", "")
	links, err := retryDump(d.h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var found []Found
	byIndex := map[int]int{} // link index -> position in found
	for _, l := range links {
		a := l.Attrs()
		if !d.owned(l) {
			continue
		}
		byIndex[a.Index] = len(found)
		found = append(found, Found{HostName: a.Name, Alias: a.Alias, HostIndex: a.Index})
	}
	if len(found) == 0 {
		return nil, nil
	}
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return d.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: d.cfg.PodTable}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list table %d: %w", d.cfg.PodTable, err)
	}
	for _, r := range routes {
		i, ok := byIndex[r.LinkIndex]
		if !ok || int(r.Protocol) != d.cfg.PodRouteProto {
			continue
		}
		if p, ok := routeDst(r); ok && p.IsSingleIP() {
			found[i].Addrs = append(found[i].Addrs, p.Addr())
		}
	}
	return found, nil
}

func retryDump[T any](dump func() ([]T, error)) ([]T, error) {
	for i := 0; ; i++ {
		xs, err := dump()
		if err == nil || !errors.Is(err, netlink.ErrDumpInterrupted) || i == dumpRetries {
			return xs, err
		}
	}
}

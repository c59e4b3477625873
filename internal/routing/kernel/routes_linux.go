package kernel

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tableState is what Table holds: the routes tagged Protocol (ours), and
// for each other prefix the protocol of a route someone else put there.
type tableState struct {
	own     map[netip.Prefix][]netlink.Route
	foreign map[netip.Prefix]int
}

func (k *Kernel) readTable() (tableState, error) {
	routes, err := k.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: k.cfg.Table}, netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return tableState{}, fmt.Errorf("list routes of table %d: %w", k.cfg.Table, err)
	}
	st := tableState{own: map[netip.Prefix][]netlink.Route{}, foreign: map[netip.Prefix]int{}}
	for _, r := range routes {
		if r.Table != k.cfg.Table || r.Dst == nil {
			continue
		}
		p, ok := prefixOf(r.Dst)
		if !ok {
			continue
		}
		if int(r.Protocol) == k.cfg.Protocol {
			st.own[p] = append(st.own[p], r)
		} else {
			st.foreign[p] = int(r.Protocol)
		}
	}
	return st, nil
}

// metric is the priority the kernel gives a route added with r's: IPv6
// routes without one get 1024.
func metric(r *netlink.Route) int {
	if r.Priority == 0 && r.Dst != nil && r.Dst.IP.To4() == nil {
		return 1024
	}
	return r.Priority
}

// sameRoute: have is what the kernel reports for want.
func sameRoute(have netlink.Route, want *netlink.Route) bool {
	return have.Type == unix.RTN_UNICAST && nextHop(have) == nextHop(*want) &&
		have.LinkIndex == want.LinkIndex && have.Flags&unix.RTNH_F_ONLINK == want.Flags&unix.RTNH_F_ONLINK &&
		metric(&have) == metric(want) && len(have.MultiPath) == 0
}

// applyRoutes makes the routes tagged Protocol in Table exactly want for
// the prefixes of cur.own and want (cur must hold every route of ours of
// those prefixes; a full Sync passes the whole table): every wanted route
// that the kernel does not hold as is gets replaced in, then every other
// route of ours is deleted. With exclusive, a wanted route of a prefix
// where cur has none of ours is added, not replaced: Update reads no
// table, and a route someone else made since the last full Sync must
// fail (EEXIST), not be overwritten. A route the kernel refuses is
// reported in failed (its block gets no route of ours at all); other
// errors end the call.
func (k *Kernel) applyRoutes(cur tableState, want map[netip.Prefix]*netlink.Route, exclusive bool) (failed map[netip.Prefix]error, err error) {
	failed = map[netip.Prefix]error{}
	for p, w := range want {
		ok := false
		for _, r := range cur.own[p] {
			if sameRoute(r, w) {
				ok = true
				break
			}
		}
		if ok {
			continue
		}
		add := k.h.RouteReplace
		if exclusive && len(cur.own[p]) == 0 {
			add = k.h.RouteAdd
		}
		if err := add(w); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("table %d already holds a route for the block that skein did not make (%w)", k.cfg.Table, err)
			}
			failed[p] = err
		}
	}
	for p, rs := range cur.own {
		w := want[p]
		kept := false
		for _, r := range rs {
			// The one route that is (or was just replaced to be) the wanted
			// one stays: same metric means the replace above overwrote it.
			if w != nil && failed[p] == nil && !kept && (sameRoute(r, w) || metric(&r) == metric(w)) {
				kept = true
				continue
			}
			if err := k.h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return failed, fmt.Errorf("delete stale route %s in table %d: %w", r.Dst, k.cfg.Table, err)
			}
		}
	}
	return failed, nil
}

// setRoutes with nil deletes every route of ours.
func (k *Kernel) setRoutes(want map[netip.Prefix]*netlink.Route) error {
	cur, err := k.readTable()
	if err != nil {
		return err
	}
	_, err = k.applyRoutes(cur, want, false)
	return err
}

// claim records that remote i routes block p, or says why it cannot: an
// invalid block, one an earlier remote claims, or one a route in Table that
// is not ours already covers.
func claim(owner map[netip.Prefix]int, remotes []routing.Remote, i int, cur tableState, table int) string {
	p := remotes[i].Block
	if !validBlock(p) {
		return fmt.Sprintf("block %q is not a canonical prefix", p)
	}
	if j, dup := owner[p]; dup {
		return fmt.Sprintf("block also claimed by %s (node %s)", remotes[j].Name, remotes[j].Node)
	}
	if proto, taken := cur.foreign[p]; taken {
		return fmt.Sprintf("table %d holds a route for the block that skein did not make (protocol %d)", table, proto)
	}
	owner[p] = i
	return ""
}

// reachability is what RouteGet says about a node address: the link it is
// directly on, or why it is not usable as a direct next hop.
type reachability struct {
	link   int
	reason string
}

func (k *Kernel) reach(a netip.Addr, cache map[netip.Addr]reachability) reachability {
	if r, ok := cache[a]; ok {
		return r
	}
	var res reachability
	routes, err := k.h.RouteGet(a.AsSlice())
	switch {
	case err != nil:
		res.reason = fmt.Sprintf("node address %s is unreachable: %v", a, err)
	case len(routes) == 0:
		res.reason = fmt.Sprintf("node address %s is unreachable: no route", a)
	case routes[0].Type == unix.RTN_LOCAL:
		res.reason = fmt.Sprintf("node address %s is an address of this node", a)
	case routes[0].Type != unix.RTN_UNICAST:
		res.reason = fmt.Sprintf("node address %s is unreachable (route type %d)", a, routes[0].Type)
	case nextHop(routes[0]).IsValid():
		res.reason = fmt.Sprintf("node address %s is not on a directly connected network (the kernel routes it via %s)", a, nextHop(routes[0]))
	case routes[0].LinkIndex <= 1:
		res.reason = fmt.Sprintf("node address %s is not on a directly connected network", a)
	default:
		res.link = routes[0].LinkIndex
	}
	cache[a] = res
	return res
}

// syncDirect routes every remote block via its node's address, which must be
// on a directly connected network: "Block via NodeAddr dev <link> table
// Table proto Protocol". An IPv4 block of a node with only an IPv6 address
// goes via that address (RTA_VIA, RFC 5549); the kernel has no IPv6 routes
// via IPv4 next hops, so the reverse case is reported.
func (k *Kernel) syncDirect(ctx context.Context, remotes []routing.Remote) ([]routing.Status, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := k.setRules(true); err != nil {
		return nil, err
	}
	cur, err := k.readTable()
	if err != nil {
		return nil, err
	}
	out, want := k.planDirect(remotes, cur)
	failed, err := k.applyRoutes(cur, want, false)
	if err != nil {
		return nil, err
	}
	finishDirect(out, failed)
	// What the vxlan mode left: its routes were replaced above or deleted
	// as stale; the device goes last.
	if err := k.deleteDevice(); err != nil {
		return out, err
	}
	if err := k.deleteGuard(); err != nil {
		return out, err
	}
	k.last = &applied{mode: routing.ModeDirect, table: tableState{own: map[netip.Prefix][]netlink.Route{}, foreign: cur.foreign}}
	k.last.setRoutes(cur, want, failed)
	return out, nil
}

// updateDirect is syncDirect for the blocks of scope alone, against the
// last Sync's record instead of the kernel's table.
func (k *Kernel) updateDirect(scope map[netip.Prefix]bool, remotes []routing.Remote) ([]routing.Status, error) {
	cur := k.last.scoped(scope)
	out, want := k.planDirect(remotes, cur)
	failed, err := k.applyRoutes(cur, want, true)
	if err != nil {
		return nil, err
	}
	finishDirect(out, failed)
	k.last.setRoutes(cur, want, failed)
	return out, nil
}

// planDirect is the direct mode's route for each remote that can have
// one, and the statuses (Via set, Installed not yet) of all.
func (k *Kernel) planDirect(remotes []routing.Remote, cur tableState) ([]routing.Status, map[netip.Prefix]*netlink.Route) {
	out := make([]routing.Status, len(remotes))
	want := map[netip.Prefix]*netlink.Route{}
	owner := map[netip.Prefix]int{}
	cache := map[netip.Addr]reachability{}
	for i, rm := range remotes {
		out[i].Remote = rm
		if out[i].Reason = claim(owner, remotes, i, cur, k.cfg.Table); out[i].Reason != "" {
			continue
		}
		b := rm.Block.Addr()
		via := addrOfFamily(rm.NodeAddrs, b.Is4())
		viaOther := false
		switch {
		case via.IsValid():
		case len(rm.NodeAddrs) == 0:
			out[i].Reason = "node has no address"
		case b.Is4():
			via, viaOther = addrOfFamily(rm.NodeAddrs, false), true
		default:
			out[i].Reason = fmt.Sprintf("node has no IPv6 address (the kernel cannot route IPv6 via IPv4 node address %s)", rm.NodeAddrs[0])
		}
		if out[i].Reason != "" {
			delete(owner, rm.Block)
			continue
		}
		r := k.reach(via, cache)
		if r.reason != "" {
			out[i].Reason = r.reason
			delete(owner, rm.Block)
			continue
		}
		route := &netlink.Route{
			Dst: ipNet(rm.Block), LinkIndex: r.link, Table: k.cfg.Table,
			Protocol: netlink.RouteProtocol(k.cfg.Protocol), Type: unix.RTN_UNICAST,
		}
		if viaOther {
			route.Via = &netlink.Via{AddrFamily: netlink.FAMILY_V6, Addr: via.AsSlice()}
		} else {
			route.Gw = via.AsSlice()
		}
		want[rm.Block] = route
		out[i].Via = via
	}
	return out, want
}

// finishDirect marks the planned statuses installed, or why not.
func finishDirect(out []routing.Status, failed map[netip.Prefix]error) {
	for i := range out {
		if out[i].Reason != "" {
			out[i].Via = netip.Addr{}
			continue
		}
		if err := failed[out[i].Block]; err != nil {
			out[i].Reason = fmt.Sprintf("the kernel refused the route via %s: %v", out[i].Via, err)
			out[i].Via = netip.Addr{}
			continue
		}
		out[i].Installed = true
	}
}

package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/skeinnet/skein/internal/routing"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// applied is what the last full Sync left in the kernel, kept up to date
// by Update. Update compares with it instead of reading the kernel: the
// dumps of a table of 3,000 routes (and as many neighbour entries) are
// most of a Sync's cost, and a change touches one block or one node.
// What someone else changes in between is repaired by the next full Sync
// (periodic): Update never overwrites a route it does not know of.
type applied struct {
	mode routing.Mode
	// table: the routes of ours as installed, and the prefixes that held
	// a route of another protocol at the last Sync.
	table tableState
	// vxlan only: the device's underlay address and index, its FDB
	// (MAC → peer) and neighbour (gateway → MAC) entries as installed,
	// the peer MAC each block of the plan uses, and how many blocks use
	// each MAC and each gateway (an entry goes when its last block does).
	local  netip.Addr
	dev    int
	fdb    map[string]netip.Addr
	neigh  map[netip.Addr]net.HardwareAddr
	macOf  map[netip.Prefix]string
	macUse map[string]int
	gwUse  map[netip.Addr]int
}

// scoped is the part of the table record for the prefixes of scope, as
// applyRoutes wants it.
func (a *applied) scoped(scope map[netip.Prefix]bool) tableState {
	st := tableState{own: map[netip.Prefix][]netlink.Route{}, foreign: map[netip.Prefix]int{}}
	for p := range scope {
		if rs, ok := a.table.own[p]; ok {
			st.own[p] = rs
		}
		if proto, ok := a.table.foreign[p]; ok {
			st.foreign[p] = proto
		}
	}
	return st
}

// setRoutes records what applyRoutes(cur, want) left for the prefixes of
// cur.own and want: the wanted route where it was not refused, none of
// ours elsewhere.
func (a *applied) setRoutes(cur tableState, want map[netip.Prefix]*netlink.Route, failed map[netip.Prefix]error) {
	for p := range cur.own {
		delete(a.table.own, p)
	}
	for p, w := range want {
		if failed[p] == nil {
			a.table.own[p] = []netlink.Route{*w}
		} else {
			delete(a.table.own, p)
		}
	}
}

// setMACs replaces the peer MACs of the blocks of scope (nil: none
// before) with those of mac, keeping the use counts.
func (a *applied) setMACs(scope map[netip.Prefix]bool, mac map[netip.Prefix]string) {
	for p := range scope {
		if m, ok := a.macOf[p]; ok {
			delete(a.macOf, p)
			a.macUse[m]--
			a.gwUse[p.Addr()]--
		}
	}
	for p, m := range mac {
		a.macOf[p] = m
		a.macUse[m]++
		a.gwUse[p.Addr()]++
	}
}

// Update applies a change of some blocks: afterwards the kernel holds for
// each prefix in blocks what Sync would for the remotes that claim it
// (remotes: all of them, in Sync's order; none = the block is gone), and
// everything else as it was. It writes only what differs from the last
// Sync's result, new and changed entries before stale ones, and reads no
// table. It returns one Status per remote. ErrFullSync means nothing was
// changed and Sync must run; after any other error the next Update
// returns ErrFullSync too.
func (k *Kernel) Update(ctx context.Context, blocks []netip.Prefix, remotes []routing.Remote) ([]routing.Status, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closeH == nil {
		return nil, errors.New("routing update: kernel closed")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("routing update: %w", err)
	}
	if k.last == nil || k.last.mode != k.cfg.Mode {
		return nil, routing.ErrFullSync
	}
	scope := make(map[netip.Prefix]bool, len(blocks))
	for _, p := range blocks {
		scope[p] = true
	}
	for _, r := range remotes {
		scope[r.Block] = true
	}
	var (
		st  []routing.Status
		err error
	)
	switch k.cfg.Mode {
	case routing.ModeDirect:
		st, err = k.updateDirect(scope, remotes)
	case routing.ModeVXLAN:
		if k.last.local != routing.UnderlayAddr(k.local) {
			return nil, routing.ErrFullSync // the device is recreated: Sync's work
		}
		st, err = k.updateVXLAN(scope, remotes)
	default:
		// Export mode installs nothing; what it reports needs every
		// table's routes, which only Sync reads.
		return nil, routing.ErrFullSync
	}
	if err != nil {
		k.last = nil
		return st, fmt.Errorf("routing update (%s) of %d blocks: %w", k.cfg.Mode, len(scope), err)
	}
	return st, nil
}

// updateVXLAN is syncVXLAN for the blocks of scope alone, against the
// last Sync's record: FDB entries for the peers, neighbours, routes, then
// the neighbours and FDB entries no block uses any more.
func (k *Kernel) updateVXLAN(scope map[netip.Prefix]bool, remotes []routing.Remote) ([]routing.Status, error) {
	a := k.last
	cur := a.scoped(scope)
	plan := k.planVXLAN(remotes, cur, a.local, a.dev)
	for m, peer := range plan.fdb {
		if have, ok := a.fdb[m]; ok && have != peer {
			// A MAC of another peer's: only the whole picture says
			// which remotes collide (planVXLAN).
			return nil, routing.ErrFullSync
		}
	}
	guard := map[string]netip.Addr{}
	for m, peer := range a.fdb {
		guard[m] = peer
	}
	added := false
	for m, peer := range plan.fdb {
		if have, ok := guard[m]; !ok || have != peer {
			guard[m], added = peer, true
		}
	}
	if added {
		// The new peers may send before their FDB entries exist; the
		// ones no block wants any more go below.
		if err := k.setGuard(guard); err != nil {
			return nil, err
		}
	}
	for m, peer := range plan.fdb {
		if have, ok := a.fdb[m]; ok && have == peer {
			continue
		}
		if err := k.setFDB(a.dev, m, peer); err != nil {
			return nil, err
		}
		a.fdb[m] = peer
	}
	neighFailed := map[netip.Addr]error{}
	for gw, mac := range plan.neigh {
		if bytes.Equal(a.neigh[gw], mac) {
			continue
		}
		if err := k.setNeigh(a.dev, gw, mac); err != nil {
			neighFailed[gw] = err
			continue
		}
		a.neigh[gw] = mac
	}
	plan.dropFailed(neighFailed)
	failed, err := k.applyRoutes(cur, plan.route, true)
	if err != nil {
		return nil, err
	}
	a.setRoutes(cur, plan.route, failed)
	old := map[string]bool{}
	for p := range scope {
		if m, ok := a.macOf[p]; ok {
			old[m] = true
		}
	}
	a.setMACs(scope, plan.mac)
	// Stale neighbours: a gateway of the scope no block wants any more,
	// or whose new entry the kernel refused (the old one would lead to
	// the old node).
	for p := range scope {
		gw := p.Addr()
		mac, have := a.neigh[gw]
		if !have || a.gwUse[gw] > 0 && neighFailed[gw] == nil {
			continue
		}
		n := &netlink.Neigh{LinkIndex: a.dev, Family: familyOf(gw), State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: mac}
		if err := k.h.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("delete stale neighbour %s on %s: %w", gw, k.cfg.VXLAN.Device, err)
		}
		delete(a.neigh, gw)
	}
	gone := false // a peer's FDB entry went: the guard loses it too
	for m := range old {
		if a.macUse[m] > 0 {
			continue
		}
		delete(a.macUse, m)
		peer, ok := a.fdb[m]
		if !ok {
			continue
		}
		hw, _ := net.ParseMAC(m)
		n := &netlink.Neigh{LinkIndex: a.dev, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT,
			HardwareAddr: hw, IP: peer.AsSlice()}
		if err := k.h.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("delete stale fdb %s dst %s on %s: %w", m, peer, k.cfg.VXLAN.Device, err)
		}
		delete(a.fdb, m)
		gone = true
	}
	for p := range scope {
		if a.gwUse[p.Addr()] <= 0 {
			delete(a.gwUse, p.Addr())
		}
	}
	if gone {
		if err := k.setGuard(a.fdb); err != nil {
			return nil, err
		}
	}
	finishVXLAN(plan.out, neighFailed, failed)
	return plan.out, nil
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

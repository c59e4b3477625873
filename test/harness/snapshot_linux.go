package harness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// State is a comparable picture of a namespace's links, addresses, routes
// (all tables, both families) and policy rules, each as a sorted list of
// one-line descriptions. Interface indexes are replaced by names so that two
// snapshots compare by meaning. Neighbour entries and counters are left out.
type State struct {
	Links  []string
	Addrs  []string
	Routes []string
	Rules  []string
}

// Snapshot records ns's current State; it calls t.Fatal on netlink errors.
//
// IPv6 state settles asynchronously: a link that gains carrier gets its
// link-local address from the kernel's link watcher (up to a second later),
// duplicate address detection runs from a work queue (about a second on links
// with carrier, a moment on lo), and only then is an address's local route
// installed. So Snapshot first waits, up to three seconds, until every link
// with carrier (but lo, and links with IPv6 disabled) has a link-local
// address and its multicast route (ff00::/8, which the link watcher adds
// with it: a link-local address installed without DAD is there before it),
// no IPv6 address on such a link is tentative, and every address past DAD
// has its local route; otherwise two snapshots of an unchanged namespace
// could differ.
func Snapshot(t testing.TB, ns *NS) State {
	t.Helper()
	h := ns.Handle(t)
	settle(t, ns, h)
	st, err := readState(h)
	// A dump that raced a change (the kernel flags it, the library
	// returns ErrDumpInterrupted) is read again until the namespace has
	// settled: a dump not flagged, or two flagged dumps 50 ms apart that
	// read the same state (in a slow emulated guest IPv6 keeps changing
	// addresses for seconds after a link comes up, and a loaded one was
	// seen flagging dumps for more than 10 s).
	for deadline := time.Now().Add(30 * time.Second); errors.Is(err, netlink.ErrDumpInterrupted) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		var again State
		again, err = readState(h)
		if errors.Is(err, netlink.ErrDumpInterrupted) && slices.Equal(again.all(), st.all()) {
			err = nil
		}
		st = again
	}
	if err != nil {
		t.Fatalf("snapshot %s: %v", ns.name, err)
	}
	return st
}

// readState describes what h's namespace holds now, as Snapshot does.
func readState(h *netlink.Handle) (State, error) {
	var st State
	var interrupted error
	links, err := h.LinkList()
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		interrupted = fmt.Errorf("links: %w", err)
	} else if err != nil {
		return st, fmt.Errorf("links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		st.Links = append(st.Links, fmt.Sprintf("%s type=%s mtu=%d up=%t alias=%q",
			a.Name, l.Type(), a.MTU, a.Flags&net.FlagUp != 0, a.Alias))
	}
	// One family per dump: a dump of both walks two tables, each with
	// its own change counter, and the kernel may flag it as interrupted
	// for that alone.
	var addrs []netlink.Addr
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		a, err := h.AddrList(nil, fam)
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			interrupted = fmt.Errorf("addrs: %w", err)
		} else if err != nil {
			return st, fmt.Errorf("addrs: %w", err)
		}
		addrs = append(addrs, a...)
	}
	for _, a := range addrs {
		st.Addrs = append(st.Addrs, fmt.Sprintf("%s dev %s", a.IPNet, names[a.LinkIndex]))
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		interrupted = fmt.Errorf("routes: %w", err)
	} else if err != nil {
		return st, fmt.Errorf("routes: %w", err)
	}
	for _, r := range routes {
		dst := "default"
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		st.Routes = append(st.Routes, fmt.Sprintf("table %d type %d %s via %v dev %s proto %d scope %d",
			r.Table, r.Type, dst, r.Gw, names[r.LinkIndex], r.Protocol, r.Scope))
	}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		interrupted = fmt.Errorf("rules: %w", err)
	} else if err != nil {
		return st, fmt.Errorf("rules: %w", err)
	}
	for _, r := range rules {
		st.Rules = append(st.Rules, fmt.Sprintf("family %d prio %d table %d src %v dst %v",
			r.Family, r.Priority, r.Table, r.Src, r.Dst))
	}
	for _, s := range [][]string{st.Links, st.Addrs, st.Routes, st.Rules} {
		slices.Sort(s)
	}
	return st, interrupted
}

// all is every line of the state, for comparing two reads.
func (st State) all() []string {
	return slices.Concat(st.Links, []string{"--"}, st.Addrs, []string{"--"}, st.Routes, []string{"--"}, st.Rules)
}

// AssertSame reports (t.Errorf) every link, address, route or rule present in
// only one of the two snapshots.
func AssertSame(t testing.TB, before, after State) {
	t.Helper()
	for _, c := range []struct {
		what string
		a, b []string
	}{
		{"links", before.Links, after.Links},
		{"addresses", before.Addrs, after.Addrs},
		{"routes", before.Routes, after.Routes},
		{"rules", before.Rules, after.Rules},
	} {
		if gone, added := diff(c.a, c.b); len(gone)+len(added) > 0 {
			t.Errorf("%s changed:\n  gone:  %s\n  added: %s", c.what,
				strings.Join(gone, "\n         "), strings.Join(added, "\n         "))
		}
	}
}

func diff(a, b []string) (onlyA, onlyB []string) {
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		count[s]--
	}
	for s, n := range count {
		for ; n > 0; n-- {
			onlyA = append(onlyA, s)
		}
		for ; n < 0; n++ {
			onlyB = append(onlyB, s)
		}
	}
	slices.Sort(onlyA)
	slices.Sort(onlyB)
	return onlyA, onlyB
}

func settle(t testing.TB, ns *NS, h *netlink.Handle) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if settled(t, ns, h) {
			return
		}
	}
}

func settled(t testing.TB, ns *NS, h *netlink.Handle) bool {
	t.Helper()
	links, err := h.LinkList()
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		return false // raced a change: the namespace is not settled
	}
	if err != nil {
		t.Fatalf("snapshot: links: %v", err)
	}
	carrier := map[int]bool{}
	for _, l := range links {
		carrier[l.Attrs().Index] = l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0 &&
			l.Attrs().RawFlags&unix.IFF_UP != 0
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		return false // raced a change: the namespace is not settled
	}
	if err != nil {
		t.Fatalf("snapshot: addrs: %v", err)
	}
	// A link that just gained carrier gets its link-local address from the
	// kernel's link watcher, up to a second later.
	hasLL := map[int]bool{}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			hasLL[a.LinkIndex] = true
		}
	}
	local, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		return false // raced a change: the namespace is not settled
	}
	if err != nil {
		t.Fatalf("snapshot: local routes: %v", err)
	}
	have := map[string]bool{}
	mcast := map[int]bool{}
	for _, r := range local {
		if r.Dst != nil {
			have[fmt.Sprintf("%d %s", r.LinkIndex, r.Dst.IP)] = true
			if ones, _ := r.Dst.Mask.Size(); r.Type == unix.RTN_MULTICAST && ones == 8 {
				mcast[r.LinkIndex] = true
			}
		}
	}
	for _, l := range links {
		a := l.Attrs()
		if !carrier[a.Index] || a.RawFlags&unix.IFF_LOOPBACK != 0 {
			continue
		}
		if !hasLL[a.Index] && !ipv6Disabled(ns, a.Name) || hasLL[a.Index] && !mcast[a.Index] {
			return false
		}
	}
	for _, a := range addrs {
		switch {
		case a.Flags&unix.IFA_F_DADFAILED != 0:
		case a.Flags&unix.IFA_F_TENTATIVE != 0:
			if carrier[a.LinkIndex] {
				return false
			}
		case !have[fmt.Sprintf("%d %s", a.LinkIndex, a.IP)]:
			return false
		}
	}
	return true
}

// ipv6Disabled reports whether link name in ns has IPv6 turned off
// (net.ipv6.conf.<name>.disable_ipv6), so gets no link-local address.
func ipv6Disabled(ns *NS, name string) bool {
	var v []byte
	_ = ns.Do(func() error {
		var err error
		v, err = os.ReadFile("/proc/sys/net/ipv6/conf/" + name + "/disable_ipv6")
		return err
	})
	return strings.TrimSpace(string(v)) == "1"
}

package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// ApplyClient converges the pod's network namespace (netnsPath) to cfg:
// FoU receive ports, one tunnel per gateway and family (plus the
// flow-based fallback devices, for what comes from a router pod's own
// address), the seed's policy rules and the routes of tables 117 and 118.
// The zero ClientConfig removes everything it made. It is idempotent and
// touches only its own objects: devices tagged with its alias, rules that
// are exactly the seed's, routes through its devices, FoU ports of its
// shape. On error the namespace is left as it was before the call (the
// journal of changes is undone; if that fails too the error wraps
// ErrUndoFailed). The calling thread's namespace is never changed.
//
// One exception to "its own": an untagged ipip (ip6tnl) device named
// exactly as a tunnel of cfg of that family is a call's that died between
// creating the device and tagging it, and is replaced; another device
// with such a name fails the call with ErrNameClash. The leftover is
// removed when its tunnel is about to be made and is not restored if the
// call fails later: "as before the call" means without it (it was never
// usable, and a retry would remove it again).
//
// A tunnel's local address is the pod's source address towards the
// ServiceIP (what the kernel would pick), so the pod's interface and
// routes must be in place first. A family the pod has no global address
// of is left out (no tunnel, rules or routes for it).
func ApplyClient(netnsPath string, cfg ClientConfig) (retErr error) {
	defer func() {
		if retErr != nil {
			retErr = fmt.Errorf("egress client %s: %w", netnsPath, retErr)
		}
	}()
	plan, err := planClient(cfg)
	if err != nil {
		return err
	}
	if err := netns.IsNetNS(netnsPath); err != nil {
		return err
	}
	if !plan.empty() {
		if err := requireFoU(); err != nil {
			return err
		}
	}
	// rp_filter off, in the switch that opens the handle and before any
	// device exists, so the tunnels inherit it from "default": replies
	// that land on the flow-based device would fail a strict
	// reverse-path check (their way back is another tunnel), and the
	// effective value is the larger of "all" and the device's. The old
	// values come back on undo, not on removal.
	var kv [][2]string
	if hasV4(plan) {
		kv = [][2]string{{"net/ipv4/conf/all/rp_filter", "0"}, {"net/ipv4/conf/default/rp_filter", "0"}}
	}
	h, rs, old, err := openHandles(netnsPath, false, kv, true)
	if err != nil {
		return err
	}
	defer h.Close()
	defer rs.Close()

	// A family the pod has no address of gets no tunnel: its traffic
	// cannot leave the pod at all (a single-stack pod of a dual-stack
	// Egress).
	if !plan.empty() {
		has, err := globalFamilies(h)
		if err != nil {
			return err
		}
		for _, v6 := range []bool{false, true} {
			if !has[boolFam(v6)] {
				plan = plan.withoutFamily(v6)
			}
		}
	}

	var j journal
	if len(old) > 0 {
		j.add(func() error { _, err := swapSysctls(netnsPath, old); return err })
	}
	if err := applyClient(h, rs, plan, &j); err != nil {
		if uerr := j.undo(); uerr != nil {
			return fmt.Errorf("%w (and undoing: %w)", err, uerr)
		}
		return err
	}
	return nil
}

// applyClient makes the changes, adding before deleting, and records the
// undo of each in j.
func applyClient(h *netlink.Handle, rs *routeSocket, plan clientPlan, j *journal) error {
	ts, err := listTunnels(h, clientPrefix4, clientPrefix6)
	if err != nil {
		return err
	}
	cur, foreign := ts.ours, ts.foreign
	// Routes of ours go through devices of ours: a pod without any (the
	// ADD of a new pod) has none, and the route dump is spared.
	var oldRoutes []route
	if len(ts.index) > 0 {
		if oldRoutes, err = listRoutes(h, []int{TableNarrow, TableWide}, ts.index); err != nil {
			return err
		}
	}
	haveFoU := map[fouPort]bool{} // none can exist without the module
	if requireFoU() == nil {
		if haveFoU, err = listFoU(h); err != nil {
			return err
		}
	}
	haveRules, err := findRulesOr(h, append(clientRules(false), clientRules(true)...), isInClusterRule)
	if err != nil {
		return err
	}
	allRules := make([]rule, 0, len(haveRules))
	for r := range haveRules {
		allRules = append(allRules, r)
	}
	sortRules(allRules)

	// 1. FoU receive ports.
	for _, f := range plan.fou {
		if haveFoU[f] {
			continue
		}
		if err := h.FouAdd(f.nl()); err != nil {
			return fmt.Errorf("add fou port %d (ipv6 %v): %w", f.port, f.v6, err)
		}
		j.add(func() error { return h.FouDel(f.nl()) })
	}

	// 2. Tunnels: keep what matches, replace what differs, add the rest.
	wantDev := map[string]bool{}
	replaced := map[string]bool{}
	index := map[string]int{} // device -> ifindex, spares a lookup per route
	for i, name := range ts.index {
		index[name] = i
	}
	for _, t := range plan.tunnels {
		wantDev[t.name] = true
		if !t.flow {
			local, err := sourceFor(h, t.remote)
			if err != nil {
				return fmt.Errorf("tunnel %s: %w", t.name, err)
			}
			t.local = local
		}
		if old, ok := cur[t.name]; ok {
			if old == t {
				continue
			}
			if err := delTunnel(h, old, oldRoutes, j); err != nil {
				return err
			}
			replaced[t.name] = true
		}
		kind, clash := foreign[t.name]
		if clash && kind == t.kind() {
			// An untagged device of the kind and name this tunnel
			// would have: a crashed call's, made and never tagged
			// (tagging is a second request). It goes, unjournaled:
			// it is no state of anyone's, and kept it would refuse
			// this gateway for good.
			if err := delLink(h, t.name); err != nil {
				return fmt.Errorf("remove the untagged leftover: %w", err)
			}
			clash = false
		}
		i, err := addTunnel(h, t, clash, j)
		if err != nil {
			return err
		}
		index[t.name] = i
	}

	// 3. Routes of tables 117 and 118 (replaced devices took theirs with
	// them; new ones have none yet).
	var routes []route
	for _, r := range oldRoutes {
		if !replaced[r.dev] {
			routes = append(routes, r)
		}
	}
	have := map[route]bool{}
	at := map[[2]any]route{} // (table, dst) -> our route there now
	for _, r := range routes {
		have[r] = true
		at[[2]any{r.table, r.dst}] = r
	}
	wantRoute := map[route]bool{}
	// Our routes replaced in place by a wanted one through another
	// device (a destination moving between gateways): they are gone
	// already, and deleting them again would fail.
	overwritten := map[route]bool{}
	for _, r := range plan.routes {
		wantRoute[r] = true
		if have[r] {
			continue
		}
		x, err := r.nlAt(h, index[r.dev])
		if err != nil {
			return err
		}
		if err := h.RouteReplace(x); err != nil {
			return fmt.Errorf("route %s dev %s table %d: %w", r.dst, r.dev, r.table, err)
		}
		if old, ok := at[[2]any{r.table, r.dst}]; ok {
			overwritten[old] = true
			j.add(func() error { return replaceRoute(h, old) })
		} else {
			j.add(func() error { return h.RouteDel(x) })
		}
	}

	// 4. Policy rules, all missing ones in one request.
	wantRule := map[rule]bool{}
	var missing []rule
	for _, r := range plan.rules {
		wantRule[r] = true
		if !haveRules[r] {
			missing = append(missing, r)
		}
	}
	added, err := addRules(rs, missing)
	for _, r := range added {
		j.add(func() error { return delRuleIfThere(h, r) })
	}
	if err != nil {
		return err
	}

	// 5. Remove what is no longer wanted: routes, rules, devices, ports.
	for _, r := range routes {
		if wantRoute[r] || !have[r] || overwritten[r] {
			continue
		}
		if err := delRoute(h, r, j); err != nil {
			return err
		}
	}
	for _, r := range allRules {
		if wantRule[r] || !haveRules[r] {
			continue
		}
		if err := h.RuleDel(r.nl()); err != nil {
			return fmt.Errorf("delete rule pref %d: %w", r.prio, err)
		}
		j.add(func() error { return h.RuleAdd(r.nl()) })
	}
	for name, t := range cur {
		if wantDev[name] || replaced[name] {
			continue
		}
		if err := delTunnel(h, t, nil, j); err != nil {
			return err
		}
	}
	// FoU ports carry no tag: those of a namespace without client state
	// (no tunnel, no rule of ours) are someone else's, such as a router
	// pod's (NewRouter's), which the zero configuration skeind applies to
	// pods naming no Egress must leave alone.
	ownFoU := len(cur) > 0
	for _, had := range haveRules {
		ownFoU = ownFoU || had
	}
	for f := range haveFoU {
		if fouWanted(plan.fou, f) || !ownFoU {
			continue
		}
		if err := h.FouDel(f.nl()); err != nil {
			return fmt.Errorf("delete fou port %d (ipv6 %v): %w", f.port, f.v6, err)
		}
		j.add(func() error { return h.FouAdd(f.nl()) })
	}
	return nil
}

func hasV4(p clientPlan) bool {
	for _, t := range p.tunnels {
		if !t.v6 {
			return true
		}
	}
	return false
}

func fouWanted(want []fouPort, f fouPort) bool {
	for _, w := range want {
		if w == f {
			return true
		}
	}
	return false
}

// globalFamilies reports, by family (0 = IPv4, 1 = IPv6), whether the
// pod has an address of global scope: one dump for both.
func globalFamilies(h *netlink.Handle) ([2]bool, error) {
	var has [2]bool
	as, err := redump(func() ([]netlink.Addr, error) { return h.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return has, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range as {
		if a.Scope == int(netlink.SCOPE_UNIVERSE) && a.IP != nil {
			has[boolFam(a.IP.To4() == nil)] = true
		}
	}
	return has, nil
}

// sourceFor is the pod's source address towards remote.
func sourceFor(h *netlink.Handle, remote netip.Addr) (netip.Addr, error) {
	rs, err := h.RouteGet(ipOf(remote))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route from the pod to service IP %s: %w", remote, err)
	}
	for _, r := range rs {
		if a := addrOf(r.Src); a.IsValid() {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no source address towards service IP %s in the pod", remote)
}

// addTunnel creates t; the undo deletes it.
func addTunnel(h *netlink.Handle, t tunnel, foreign bool, j *journal) (int, error) {
	l := t.link()
	if err := h.LinkAdd(l); err != nil {
		if errors.Is(err, unix.EEXIST) {
			if foreign {
				return 0, fmt.Errorf("create %s: %w", t.name, ErrNameClash)
			}
			// Only one flow-based device per kind fits in a namespace.
			return 0, fmt.Errorf("create %s: a device of this kind and address pair exists already: %w", t.name, err)
		}
		return 0, fmt.Errorf("create tunnel %s: %w", t.name, unsupported(err, t))
	}
	j.add(func() error { return delLink(h, t.name) })
	return tagLink(h, t, l)
}

// tagLink sets the alias of t, just made as l, the tag that marks it ours
// (the kernel ignores IFLA_IFALIAS in a link's creation request), and
// returns its index. LinkAdd has looked the index up into l already; it
// is looked up again only when it has not.
func tagLink(h *netlink.Handle, t tunnel, l netlink.Link) (int, error) {
	var err error
	if l.Attrs().Index == 0 {
		l, err = h.LinkByName(t.name)
	}
	if err == nil {
		err = h.LinkSetAlias(l, t.alias)
	}
	if err != nil {
		return 0, fmt.Errorf("tag %s: %w", t.name, err)
	}
	return l.Attrs().Index, nil
}

// delTunnel deletes t; the undo makes it again with the routes listed
// for it in routes.
func delTunnel(h *netlink.Handle, t tunnel, routes []route, j *journal) error {
	if err := delLink(h, t.name); err != nil {
		return err
	}
	var mine []route
	for _, r := range routes {
		if r.dev == t.name {
			mine = append(mine, r)
		}
	}
	j.add(func() error {
		l := t.link()
		if err := h.LinkAdd(l); err != nil {
			return fmt.Errorf("recreate %s: %w", t.name, err)
		}
		if _, err := tagLink(h, t, l); err != nil {
			return err
		}
		for _, r := range mine {
			if err := replaceRoute(h, r); err != nil {
				return err
			}
		}
		return nil
	})
	return nil
}

// delRuleIfThere deletes r, one this call added; not finding it is no
// error (addRules reports rules as maybe added when it cannot tell).
func delRuleIfThere(h *netlink.Handle, r rule) error {
	if err := h.RuleDel(r.nl()); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete rule pref %d: %w", r.prio, err)
	}
	return nil
}

func delLink(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

func replaceRoute(h *netlink.Handle, r route) error {
	x, err := r.nl(h)
	if err != nil {
		return err
	}
	if err := h.RouteReplace(x); err != nil {
		return fmt.Errorf("route %s dev %s table %d: %w", r.dst, r.dev, r.table, err)
	}
	return nil
}

func delRoute(h *netlink.Handle, r route, j *journal) error {
	x, err := r.nl(h)
	if err != nil {
		return err
	}
	if err := h.RouteDel(x); err != nil {
		return fmt.Errorf("delete route %s dev %s table %d: %w", r.dst, r.dev, r.table, err)
	}
	j.add(func() error { return replaceRoute(h, r) })
	return nil
}

// ClientStatus is what ApplyClient made in a pod, read back from the
// kernel. Every slice is sorted; all are empty when the pod has no egress.
type ClientStatus struct {
	Tunnels  []TunnelStatus
	FoUPorts []FoUPortStatus
	Routes   []RouteStatus
	Rules    []RuleStatus
}

// Empty reports whether nothing of ApplyClient's is in the namespace.
func (s ClientStatus) Empty() bool {
	return len(s.Tunnels)+len(s.FoUPorts)+len(s.Routes)+len(s.Rules) == 0
}

// TunnelStatus is one tunnel device.
type TunnelStatus struct {
	Device    string
	Gateway   string // "<namespace>/<name>"; empty for a flow-based device
	IPv6      bool
	FlowBased bool       // the fallback device for replies from router pods
	Remote    netip.Addr // the Service's ClusterIP
	Local     netip.Addr // the pod's address
	// SourcePort is the encapsulation's UDP source port, 0 when chosen
	// per flow; DestPort the FoU port.
	SourcePort, DestPort int
}

// FoUPortStatus is one FoU receive port (IPIP for IPv4, IPv6-in-IPv6 for
// IPv6).
type FoUPortStatus struct {
	IPv6 bool
	Port int
}

// RouteStatus is one route through a tunnel.
type RouteStatus struct {
	Table  int
	Dst    netip.Prefix
	Device string
}

// RuleStatus is one of the seed's policy rules. Dst is the zero prefix
// for a rule that applies to every destination.
type RuleStatus struct {
	Priority int
	IPv6     bool
	Dst      netip.Prefix
	Table    int
}

// ClientState reads back what ApplyClient made in the pod namespace at
// netnsPath. On a kernel without fou it reports no FoU ports.
func ClientState(netnsPath string) (ClientStatus, error) {
	if err := netns.IsNetNS(netnsPath); err != nil {
		return ClientStatus{}, fmt.Errorf("egress client state: %w", err)
	}
	h, err := openHandle(netnsPath, false)
	if err != nil {
		return ClientStatus{}, fmt.Errorf("egress client state: %w", err)
	}
	defer h.Close()
	var s ClientStatus
	found, err := listTunnels(h, clientPrefix4, clientPrefix6)
	if err != nil {
		return s, fmt.Errorf("egress client state: %w", err)
	}
	for _, t := range found.ours {
		s.Tunnels = append(s.Tunnels, TunnelStatus{
			Device: t.name, Gateway: strings.TrimPrefix(strings.TrimPrefix(t.alias, aliasFlow), aliasGW),
			IPv6: t.v6, FlowBased: t.flow, Remote: t.remote, Local: t.local,
			SourcePort: int(t.sport), DestPort: int(t.dport),
		})
	}
	sort.Slice(s.Tunnels, func(i, j int) bool { return s.Tunnels[i].Device < s.Tunnels[j].Device })
	rs, err := listRoutes(h, []int{TableNarrow, TableWide}, found.index)
	if err != nil {
		return s, fmt.Errorf("egress client state: %w", err)
	}
	for _, r := range rs {
		s.Routes = append(s.Routes, RouteStatus{Table: r.table, Dst: r.dst, Device: r.dev})
	}
	sort.Slice(s.Routes, func(i, j int) bool {
		a, b := s.Routes[i], s.Routes[j]
		if a.Table != b.Table {
			return a.Table < b.Table
		}
		return a.Dst.String() < b.Dst.String()
	})
	have, err := findRulesOr(h, append(clientRules(false), clientRules(true)...), isInClusterRule)
	if err != nil {
		return s, fmt.Errorf("egress client state: %w", err)
	}
	all := make([]rule, 0, len(have))
	for r := range have {
		all = append(all, r)
	}
	sortRules(all)
	for _, r := range all {
		s.Rules = append(s.Rules, RuleStatus{Priority: r.prio, IPv6: r.v6, Dst: r.dst, Table: r.table})
	}
	if requireFoU() == nil {
		fs, err := listFoU(h)
		if err != nil {
			return s, fmt.Errorf("egress client state: %w", err)
		}
		for f := range fs {
			s.FoUPorts = append(s.FoUPorts, FoUPortStatus{IPv6: f.v6, Port: f.port})
		}
		sort.Slice(s.FoUPorts, func(i, j int) bool {
			if s.FoUPorts[i].IPv6 != s.FoUPorts[j].IPv6 {
				return !s.FoUPorts[i].IPv6
			}
			return s.FoUPorts[i].Port < s.FoUPorts[j].Port
		})
	}
	return s, nil
}

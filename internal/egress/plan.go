package egress

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sort"
	"strings"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrInvalid: the configuration is malformed. Nothing was changed.
	ErrInvalid = errors.New("invalid egress configuration")
	// ErrNotSupported: the kernel lacks a module the tunnels need (fou,
	// ipip, ip6_tunnel). Nothing was changed.
	ErrNotSupported = errors.New("kernel feature not available")
	// ErrNameClash: a device with one of our names exists but was not
	// made by this package; it was left alone.
	ErrNameClash = errors.New("device name taken by a foreign device")
	// ErrUndoFailed: a change failed and putting the namespace back as it
	// was failed too; some of what the call made may remain.
	ErrUndoFailed = errors.New("undo failed; the namespace may be half-changed")
)

// Device names. A client pod has one tunnel per gateway and family, named
// after a hash of "<namespace>/<name>" so that any Egress name fits
// IFNAMSIZ; a router has one per client pod address, named after a hash
// of the address. The flow-based fallback devices of a client are the
// only names without eight hex digits, so they cannot clash with a hash.
const (
	clientPrefix4 = "egr4-"
	clientPrefix6 = "egr6-"
	routerPrefix4 = "egc4-"
	routerPrefix6 = "egc6-"
	flowDevice4   = "egr4-flow"
	flowDevice6   = "egr6-flow"

	// aliasPrefix starts the IFLA_IFALIAS of every device this package
	// makes: the tag that tells ours from a foreign device of the same
	// name, and that lets ClientState name the gateway behind a hash.
	aliasPrefix = "skein-egress:"
	aliasGW     = aliasPrefix + "gw:"   // + "<ns>/<name>"
	aliasFlow   = aliasPrefix + "flow"  // client fallback devices
	aliasPeer   = aliasPrefix + "peer:" // + client address (router side)
)

// Router policy routing: replies to client pods that arrive on the
// router's outbound interface (after conntrack has undone the SNAT) are
// looked up in RouterTable, which holds one "<client>/32 dev egc4-.."
// route per peer. The router's own traffic (iif lo), including the
// encapsulated packets to the clients, never matches the rule.
const (
	RouterTable    = 118
	RouterRulePrio = 1900
)

// NFTable is the nftables table (family inet) a router owns.
const NFTable = "skein-egress"

const (
	tableMain = 254
)

func hash8(s string) string {
	h := fnv.New32a()
	h.Write([]byte(s))
	return fmt.Sprintf("%08x", h.Sum32())
}

func clientTunnelName(v6 bool, ns, name string) string {
	if v6 {
		return clientPrefix6 + hash8(ns+"/"+name)
	}
	return clientPrefix4 + hash8(ns+"/"+name)
}

// routerName4 is the device name of an IPv4 peer: its address's eight
// hex digits, so two peers cannot share one.
func routerName4(peer netip.Addr) string {
	b := peer.As4()
	return fmt.Sprintf("%s%02x%02x%02x%02x", routerPrefix4, b[0], b[1], b[2], b[3])
}

// routerName6 is the k-th candidate device name of an IPv6 peer: 128 bits
// do not fit IFNAMSIZ, so a hash of the address (k = 0), or of
// "<address>#k" after a collision.
func routerName6(peer netip.Addr, k int) string {
	if k == 0 {
		return routerPrefix6 + hash8(peer.String())
	}
	return routerPrefix6 + hash8(fmt.Sprintf("%s#%d", peer, k))
}

// maxNameProbes bounds the candidates tried for an IPv6 peer; 32-bit
// hashes that collide that often do not happen by chance.
const maxNameProbes = 64

// peerNames gives each peer (valid, unique) a device name. IPv4 names are
// the address. An IPv6 peer keeps the name of its tunnel in cur (name ->
// remote address: the kernel's tunnels are the record of the mapping, so
// it survives nothing but is rebuilt from what is there), or gets the
// first of its candidates that no other peer, no other tunnel in cur and
// no device in taken (foreign devices of our names) holds. Names are
// handed out in address order, so the result depends only on the
// arguments.
func peerNames(peers []netip.Addr, cur map[string]netip.Addr, taken map[string]bool) (map[netip.Addr]string, error) {
	out := make(map[netip.Addr]string, len(peers))
	used := map[string]bool{}
	want := map[netip.Addr]bool{}
	for _, p := range peers {
		if p.Is4() {
			n := routerName4(p)
			out[p], used[n] = n, true
		} else {
			want[p] = true
		}
	}
	curNames := make([]string, 0, len(cur))
	for n := range cur {
		curNames = append(curNames, n)
	}
	sort.Strings(curNames)
	for _, n := range curNames {
		p := cur[n]
		if want[p] && out[p] == "" && !used[n] && strings.HasPrefix(n, routerPrefix6) {
			out[p], used[n] = n, true
		}
	}
	sorted := append([]netip.Addr(nil), peers...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Less(sorted[j]) })
	var errs []error
	for _, p := range sorted {
		if !want[p] || out[p] != "" {
			continue
		}
		for k := 0; k < maxNameProbes; k++ {
			n := routerName6(p, k)
			if o, ok := cur[n]; used[n] || taken[n] || ok && o != p {
				continue
			}
			out[p], used[n] = n, true
			break
		}
		if out[p] == "" {
			errs = append(errs, fmt.Errorf("peer %s: no free device name in %d tries: %w", p, maxNameProbes, ErrInvalid))
		}
	}
	return out, errors.Join(errs...)
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ first, last netip.Addr }

// lastAddr is the highest address of p (masked).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// destRanges validates the destinations of an Egress and merges them into
// sorted, disjoint, non-adjacent ranges per family (what an nftables
// interval set holds).
func destRanges(ds []netip.Prefix) (v4, v6 []addrRange, err error) {
	var rs []addrRange
	for _, d := range ds {
		if !d.IsValid() || d.Addr().Is4In6() || d.Addr().Zone() != "" {
			return nil, nil, fmt.Errorf("destination %q is not a valid prefix: %w", d, ErrInvalid)
		}
		d = d.Masked()
		rs = append(rs, addrRange{d.Addr(), lastAddr(d)})
	}
	v4, v6 = mergeRanges(rs)
	return v4, v6, nil
}

// routerDestRanges is what a router forwards to from its tunnels for an
// Egress with destinations ds: what a client routes through it
// (clientRules), so that a client crafting its own encapsulated packets
// gets no further. Link-local addresses never (a client keeps them on
// main, first); a destination narrower than a default route as given; a
// default route (0.0.0.0/0, ::/0) only outside the private ranges, which
// a client sends to main before its default route. (A client also keeps
// the cluster's pod pools that are not private ranges on main; a router
// does not know them, so it forwards to them under a default route.)
func routerDestRanges(ds []netip.Prefix) (v4, v6 []addrRange, err error) {
	if _, _, err := destRanges(ds); err != nil {
		return nil, nil, err
	}
	var rs []addrRange
	for _, d := range ds {
		d = d.Masked()
		r := []addrRange{{d.Addr(), lastAddr(d)}}
		if d.Bits() == 0 {
			priv := private4
			if d.Addr().Is6() {
				priv = private6
			}
			for _, p := range priv {
				r = subtractRange(r, p)
			}
		}
		ll := linkLocal4
		if d.Addr().Is6() {
			ll = linkLocal6
		}
		rs = append(rs, subtractRange(r, ll)...)
	}
	v4, v6 = mergeRanges(rs)
	return v4, v6, nil
}

// subtractRange is rs without the addresses of p.
func subtractRange(rs []addrRange, p netip.Prefix) []addrRange {
	p = p.Masked()
	first, last := p.Addr(), lastAddr(p)
	var out []addrRange
	for _, r := range rs {
		if r.first.Is6() != first.Is6() || r.last.Less(first) || last.Less(r.first) {
			out = append(out, r)
			continue
		}
		if r.first.Less(first) {
			out = append(out, addrRange{r.first, first.Prev()})
		}
		if last.Less(r.last) {
			out = append(out, addrRange{last.Next(), r.last})
		}
	}
	return out
}

// mergeRanges sorts rs and merges overlapping and adjacent ranges, per
// family.
func mergeRanges(rs []addrRange) (v4, v6 []addrRange) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].first.Less(rs[j].first) })
	for _, r := range rs {
		out := &v4
		if r.first.Is6() {
			out = &v6
		}
		if n := len(*out); n > 0 {
			prev := &(*out)[n-1]
			// Sorted by first: r overlaps prev or follows it directly
			// when it starts no later than prev.last+1 (which does not
			// exist when prev reaches the family's last address).
			if next := prev.last.Next(); !next.IsValid() || r.first.Compare(next) <= 0 {
				if prev.last.Less(r.last) {
					prev.last = r.last
				}
				continue
			}
		}
		*out = append(*out, r)
	}
	return v4, v6
}

// tunnel is one tunnel device as this package makes it.
type tunnel struct {
	name   string
	v6     bool
	flow   bool       // collect_md fallback device: no addresses, no encap
	remote netip.Addr // ServiceIP (client) or client address (router)
	local  netip.Addr // resolved by the kernel step on the client side
	sport  uint16     // 0: per flow
	dport  uint16
	alias  string
}

// route is one route of ours: dst in table through dev.
type route struct {
	table int
	dst   netip.Prefix
	dev   string
}

// rule is one policy rule of ours. dst is zero for "from all", iif empty
// for any input interface.
type rule struct {
	prio  int
	v6    bool
	dst   netip.Prefix
	iif   string
	table int
}

// fouPort is one FoU receive port: family and port; the protocol follows
// from the family (4 = IPIP for IPv4, 41 = IPv6-in-IPv6 for IPv6).
type fouPort struct {
	v6   bool
	port int
}

// clientPlan is the wanted state of a client pod, computed purely from a
// ClientConfig.
type clientPlan struct {
	tunnels []tunnel // hash-named tunnels, then fallback devices; local unset
	routes  []route
	rules   []rule
	fou     []fouPort
}

func (p clientPlan) empty() bool { return len(p.tunnels) == 0 }

var (
	linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")
	linkLocal6 = netip.MustParsePrefix("fe80::/10")
	private4   = []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
	}
	private6 = []netip.Prefix{netip.MustParsePrefix("fc00::/7")}
)

// clientRules are the seed's policy rules for one family.
func clientRules(v6 bool) []rule {
	ll, priv := linkLocal4, private4
	if v6 {
		ll, priv = linkLocal6, private6
	}
	rs := []rule{
		{prio: PrioLinkLocal, v6: v6, dst: ll, table: tableMain},
		{prio: PrioNarrow, v6: v6, table: TableNarrow},
	}
	for i, p := range priv {
		rs = append(rs, rule{prio: PrioPrivate + i, v6: v6, dst: p, table: tableMain})
	}
	return append(rs, rule{prio: PrioWide, v6: v6, table: TableWide})
}

// inClusterRules are the "to <dst> lookup main" rules of one family: each
// tunnel's ServiceIP as a host prefix at PrioServiceIP (before table
// 117), so that the tunnel's own packets are routed by main whatever the
// Service range and the destinations; the in-cluster networks
// (validated, masked) of the family at PrioInCluster. Sorted by
// destination, without duplicates (a ServiceIP inside an in-cluster
// network keeps its own rule).
func inClusterRules(v6 bool, ts []tunnel, nets []netip.Prefix) []rule {
	seen := map[netip.Prefix]bool{}
	serviceIPs := map[netip.Prefix]bool{}
	var dsts []netip.Prefix
	add := func(d netip.Prefix) {
		if !seen[d] {
			seen[d] = true
			dsts = append(dsts, d)
		}
	}
	for _, t := range ts {
		if !t.flow && t.v6 == v6 {
			d := netip.PrefixFrom(t.remote, t.remote.BitLen())
			serviceIPs[d] = true
			add(d)
		}
	}
	for _, n := range nets {
		if n.Addr().Is6() == v6 {
			add(n)
		}
	}
	sort.Slice(dsts, func(i, j int) bool { return lessPrefix(dsts[i], dsts[j]) })
	rs := make([]rule, 0, len(dsts))
	for _, d := range dsts {
		prio := PrioInCluster
		if serviceIPs[d] {
			prio = PrioServiceIP
		}
		rs = append(rs, rule{prio: prio, v6: v6, dst: d, table: tableMain})
	}
	return rs
}

// isInClusterRule: r is one of ours by its shape (a destination to main
// at a priority of the in-cluster range), whatever the destination.
func isInClusterRule(r rule) bool {
	return (r.prio == PrioServiceIP || r.prio >= PrioInCluster && r.prio < prioInClusterEnd) && r.table == tableMain &&
		r.dst.IsValid() && r.iif == ""
}

// sortRules orders rules IPv4 first, then by priority, then by
// destination.
func sortRules(rs []rule) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.v6 != b.v6 {
			return !a.v6
		}
		if a.prio != b.prio {
			return a.prio < b.prio
		}
		return lessPrefix(a.dst, b.dst)
	})
}

func lessPrefix(a, b netip.Prefix) bool {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c < 0
	}
	return a.Bits() < b.Bits()
}

// planClient validates cfg and computes what the pod namespace should
// hold. Gateways are taken in order of "<namespace>/<name>"; a
// destination already routed by an earlier gateway is skipped, as is one
// whose family the gateway has no ServiceIP for. A tunnel is made for a
// gateway and family only when at least one destination uses it.
func planClient(cfg ClientConfig) (clientPlan, error) {
	if len(cfg.InCluster) > MaxInCluster {
		return clientPlan{}, fmt.Errorf("%d in-cluster networks, at most %d: %w", len(cfg.InCluster), MaxInCluster, ErrInvalid)
	}
	nets := make([]netip.Prefix, 0, len(cfg.InCluster))
	for _, n := range cfg.InCluster {
		if !n.IsValid() || n.Addr().Is4In6() || n.Addr().Zone() != "" || n.Bits() == 0 {
			return clientPlan{}, fmt.Errorf("in-cluster network %q is not a valid prefix longer than /0: %w", n, ErrInvalid)
		}
		nets = append(nets, n.Masked())
	}
	gws := append([]Gateway(nil), cfg.Gateways...)
	sort.Slice(gws, func(i, j int) bool {
		return gws[i].Namespace+"/"+gws[i].Name < gws[j].Namespace+"/"+gws[j].Name
	})
	var p clientPlan
	seenGW := map[string]bool{}
	names := map[string]string{}
	routed := map[netip.Prefix]bool{}
	fous := map[fouPort]bool{}
	var any4, any6 bool // a tunnel of the family: the flow-based device too
	for _, g := range gws {
		id := g.Namespace + "/" + g.Name
		if g.Namespace == "" || g.Name == "" {
			return clientPlan{}, fmt.Errorf("gateway %q: namespace and name are required: %w", id, ErrInvalid)
		}
		if seenGW[id] {
			return clientPlan{}, fmt.Errorf("gateway %s listed twice: %w", id, ErrInvalid)
		}
		seenGW[id] = true
		port := g.Port
		if port == 0 {
			port = DefaultPort
		}
		if port < 1 || port > 65535 {
			return clientPlan{}, fmt.Errorf("gateway %s: port %d out of range: %w", id, g.Port, ErrInvalid)
		}
		var svc [2]netip.Addr // by family: 0 = IPv4, 1 = IPv6
		for _, a := range g.ServiceIPs {
			if !a.IsValid() || a.Is4In6() || a.Zone() != "" || a.IsUnspecified() {
				return clientPlan{}, fmt.Errorf("gateway %s: service IP %q is not a plain unicast address: %w", id, a, ErrInvalid)
			}
			f := fam(a)
			if svc[f].IsValid() {
				return clientPlan{}, fmt.Errorf("gateway %s: two service IPs of one family (%s, %s): %w", id, svc[f], a, ErrInvalid)
			}
			svc[f] = a
		}
		used := [2]bool{}
		for _, d := range g.Destinations {
			if !d.IsValid() || d.Addr().Is4In6() || d.Addr().Zone() != "" {
				return clientPlan{}, fmt.Errorf("gateway %s: destination %q is not a valid prefix: %w", id, d, ErrInvalid)
			}
			d = d.Masked()
			f := fam(d.Addr())
			if !svc[f].IsValid() || routed[d] {
				continue
			}
			routed[d] = true
			used[f] = true
			table := TableNarrow
			if d.Bits() == 0 {
				table = TableWide
			}
			p.routes = append(p.routes, route{table: table, dst: d, dev: clientTunnelName(f == 1, g.Namespace, g.Name)})
		}
		for f := 0; f < 2; f++ {
			if !used[f] {
				continue
			}
			name := clientTunnelName(f == 1, g.Namespace, g.Name)
			if other, ok := names[name]; ok {
				return clientPlan{}, fmt.Errorf("gateways %s and %s hash to the same device name %s: %w", other, id, name, ErrInvalid)
			}
			names[name] = id
			t := tunnel{name: name, v6: f == 1, remote: svc[f], sport: uint16(port), dport: uint16(port), alias: aliasGW + id}
			if g.SourcePortAuto {
				t.sport = 0
			}
			if f == 1 {
				any6 = true
			} else {
				any4 = true
			}
			p.tunnels = append(p.tunnels, t)
			fous[fouPort{v6: f == 1, port: port}] = true
		}
	}
	// The flow-based devices take what comes from a router pod's own
	// address rather than the ClusterIP: every reply with per-flow source
	// ports, and with the fixed port too once the node's conntrack entry
	// of the pod's outer flow is gone (idle past the UDP timeout, or
	// flushed) and the router speaks first, say an external server
	// sending on a quiet connection: without them that traffic is
	// dropped, and the connection with it.
	if any4 {
		p.tunnels = append(p.tunnels, tunnel{name: flowDevice4, flow: true, alias: aliasFlow})
	}
	if any6 {
		p.tunnels = append(p.tunnels, tunnel{name: flowDevice6, v6: true, flow: true, alias: aliasFlow})
	}
	has := [2]bool{}
	for _, t := range p.tunnels {
		has[boolFam(t.v6)] = true
	}
	for f := 0; f < 2; f++ {
		if has[f] {
			p.rules = append(p.rules, clientRules(f == 1)...)
			p.rules = append(p.rules, inClusterRules(f == 1, p.tunnels, nets)...)
		}
	}
	sortRules(p.rules)
	for k := range fous {
		p.fou = append(p.fou, k)
	}
	sort.Slice(p.fou, func(i, j int) bool {
		if p.fou[i].v6 != p.fou[j].v6 {
			return !p.fou[i].v6
		}
		return p.fou[i].port < p.fou[j].port
	})
	return p, nil
}

func fam(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

func boolFam(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
}

// withoutFamily drops from p everything of one family (tunnels, their
// routes, rules and FoU ports): for a pod that has no address of it.
func (p clientPlan) withoutFamily(v6 bool) clientPlan {
	var out clientPlan
	for _, t := range p.tunnels {
		if t.v6 != v6 {
			out.tunnels = append(out.tunnels, t)
		}
	}
	for _, r := range p.routes {
		if r.dst.Addr().Is6() != v6 {
			out.routes = append(out.routes, r)
		}
	}
	for _, r := range p.rules {
		if r.v6 != v6 {
			out.rules = append(out.rules, r)
		}
	}
	for _, f := range p.fou {
		if f.v6 != v6 {
			out.fou = append(out.fou, f)
		}
	}
	return out
}

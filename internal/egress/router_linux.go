package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// RouterConfig configures the router side in one router pod. Zero values
// are the documented defaults.
type RouterConfig struct {
	// NetNS is the path of the router pod's namespace; "" is the
	// namespace the process runs in (skein-egress in its pod).
	NetNS string
	// Port is the FoU port; DefaultPort when 0.
	Port int
	// Local4 and Local6 are the router pod's own addresses, the local
	// ends of its tunnels. A zero address turns that family off.
	Local4, Local6 netip.Addr
	// OutInterface is where SNAT'd traffic leaves; "" is "eth0".
	OutInterface string
	// SourcePortAuto picks the encapsulation's UDP source port per flow
	// instead of Port. The replies then come from this pod's address,
	// not from the ClusterIP, and land on the clients' flow-based
	// fallback devices (ApplyClient always makes them).
	SourcePortAuto bool
}

// RouterStats are a router's counters, read from the kernel.
type RouterStats struct {
	Tunnels int // tunnel devices present
	Peers   int // client addresses in the last SyncPeers that have a tunnel
	// ConntrackEntries are the connection-tracking entries whose original
	// source is a peer and whose replies go to another address: the
	// sessions SNAT'd for clients (not the tunnels' own FoU flows, nor a
	// client's direct connections to the router pod).
	ConntrackEntries int
	// Packets and Bytes forwarded between tunnels and the outside, both
	// directions (nftables counters).
	Packets, Bytes uint64
	// NATConnections counts connections masqueraded (the first packet of
	// each passes the nat chain).
	NATConnections uint64
	// DroppedSource counts packets out of a tunnel whose inner source was
	// not that tunnel's client; DroppedDestination, those to an address
	// outside the destinations (SyncDestinations).
	DroppedSource, DroppedDestination uint64
}

// Router is the router side of one router pod. Its methods may be called
// from any goroutine.
//
// It forwards from its tunnels only what a peer sends as itself (each
// tunnel accepts its own client's address as the inner source, nothing
// else) to a destination given to SyncDestinations; see nft_linux.go.
type Router struct {
	cfg RouterConfig
	h   *netlink.Handle // also conntrack: a removed peer's entries are deleted
	nft *nftables.Conn
	ct  *nl.NetlinkSocket // Stats' conntrack dumps

	mu    sync.Mutex
	peers map[netip.Addr]bool
	// unflushed are removed peers whose conntrack entries could not all
	// be deleted yet: SyncPeers tries again (unless the peer is back).
	unflushed map[netip.Addr]bool
	closed    bool
}

// NewRouter prepares the router pod's namespace: forwarding on, rp_filter
// off, FoU receive ports for the enabled families, the nftables table and
// the policy rule to RouterTable. Tunnels left by an earlier run are
// removed (SyncPeers makes the current ones); everything else is adopted
// or replaced, so NewRouter may be called again after a crash. The
// sysctls are read first and only those not yet right are written, so a
// pod whose /proc/sys is read-only works when they are set for it.
func NewRouter(cfg RouterConfig) (_ *Router, retErr error) {
	defer func() {
		if retErr != nil {
			retErr = fmt.Errorf("egress router: %w", retErr)
		}
	}()
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.OutInterface == "" {
		cfg.OutInterface = "eth0"
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("port %d out of range: %w", cfg.Port, ErrInvalid)
	}
	if (cfg.Local4.IsValid() && !cfg.Local4.Is4()) || (cfg.Local6.IsValid() && (!cfg.Local6.Is6() || cfg.Local6.Is4In6())) {
		return nil, fmt.Errorf("local addresses %s, %s are not of their families: %w", cfg.Local4, cfg.Local6, ErrInvalid)
	}
	if !cfg.Local4.IsValid() && !cfg.Local6.IsValid() {
		return nil, fmt.Errorf("no local address: %w", ErrInvalid)
	}
	if len(cfg.OutInterface) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("interface name %q too long: %w", cfg.OutInterface, ErrInvalid)
	}
	if cfg.NetNS != "" {
		if err := netns.IsNetNS(cfg.NetNS); err != nil {
			return nil, err
		}
	}
	if err := requireFoU(); err != nil {
		return nil, err
	}
	h, err := openHandle(cfg.NetNS, true)
	if err != nil {
		return nil, err
	}
	ct, err := ctSocket(cfg.NetNS)
	if err != nil {
		h.Close()
		return nil, err
	}
	c, err := nftConn(cfg.NetNS)
	if err != nil {
		h.Close()
		ct.Close()
		return nil, err
	}
	r := &Router{cfg: cfg, h: h, nft: c, ct: ct, peers: map[netip.Addr]bool{}, unflushed: map[netip.Addr]bool{}}
	if err := r.setup(); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Router) families() []bool {
	var out []bool
	if r.cfg.Local4.IsValid() {
		out = append(out, false)
	}
	if r.cfg.Local6.IsValid() {
		out = append(out, true)
	}
	return out
}

func (r *Router) rules() []rule {
	var out []rule
	for _, v6 := range r.families() {
		out = append(out, rule{prio: RouterRulePrio, v6: v6, iif: r.cfg.OutInterface, table: RouterTable})
	}
	return out
}

func (r *Router) setup() error {
	kv := [][2]string{
		{"net.ipv4.conf.all.rp_filter", "0"}, {"net.ipv4.conf.default.rp_filter", "0"},
	}
	if r.cfg.Local4.IsValid() {
		kv = append(kv, [2]string{"net.ipv4.ip_forward", "1"})
	}
	if r.cfg.Local6.IsValid() {
		kv = append(kv, [2]string{"net.ipv6.conf.all.forwarding", "1"})
	}
	if err := ensureSysctls(r.cfg.NetNS, kv); err != nil {
		return err
	}
	have, err := listFoU(r.h)
	if err != nil {
		return err
	}
	for _, v6 := range r.families() {
		f := fouPort{v6: v6, port: r.cfg.Port}
		if have[f] {
			continue
		}
		if err := r.h.FouAdd(f.nl()); err != nil {
			return fmt.Errorf("add fou port %d (ipv6 %v): %w", f.port, v6, err)
		}
	}
	// Leftover tunnels of an earlier run: their peers come back with the
	// next SyncPeers.
	old, err := listTunnels(r.h, routerPrefix4, routerPrefix6)
	if err != nil {
		return err
	}
	for name := range old.ours {
		if err := delLink(r.h, name); err != nil {
			return err
		}
	}
	// So are untagged tunnels with a peer's device name: a run that died
	// between creating one and tagging it. A router pod holds nothing
	// else of these kinds and names, and left there each would refuse its
	// peer for good (ErrNameClash).
	for name := range old.foreign {
		l, err := r.h.LinkByName(name)
		if err != nil {
			continue // gone meanwhile
		}
		if !isPeerName(name) || (l.Type() != "ipip" && l.Type() != "ip6tnl") {
			continue
		}
		if err := delLink(r.h, name); err != nil {
			return err
		}
	}
	if err := installNFT(r.nft, r.cfg.OutInterface); err != nil {
		return err
	}
	want := r.rules()
	haveRules, err := findRules(r.h, want)
	if err != nil {
		return err
	}
	for _, x := range want {
		if !haveRules[x] {
			if err := r.h.RuleAdd(x.nl()); err != nil {
				return fmt.Errorf("add rule pref %d iif %s: %w", x.prio, x.iif, err)
			}
		}
	}
	return nil
}

// isPeerName reports whether name has the shape of a peer's device name:
// a router prefix and eight hex digits (an IPv4 address, or a hash).
func isPeerName(name string) bool {
	for _, p := range []string{routerPrefix4, routerPrefix6} {
		if h, ok := strings.CutPrefix(name, p); ok && len(h) == 8 && strings.Trim(h, "0123456789abcdef") == "" {
			return true
		}
	}
	return false
}

func (r *Router) tunnelFor(peer netip.Addr, name string) tunnel {
	t := tunnel{name: name, v6: peer.Is6(), remote: peer, local: r.cfg.Local4,
		sport: uint16(r.cfg.Port), dport: uint16(r.cfg.Port), alias: aliasPeer + peer.String()}
	if t.v6 {
		t.local = r.cfg.Local6
	}
	if r.cfg.SourcePortAuto {
		t.sport = 0
	}
	return t
}

// SyncPeers converges the tunnels to exactly one per peer (client pod
// address), each with its route in RouterTable and its (device, address)
// pair in the nftables peer set; tunnels of other peers are removed, and
// so are the conntrack entries whose original source is a removed peer
// (the sessions SNAT'd for it, and its tunnel's own flow: a pod made
// later with the address must not get their replies). Peers of a family
// the router has no local address for are skipped (and reported in the
// error). It does what it can for every peer and returns the errors
// joined: one bad peer does not cut off the others.
//
// Device names: an IPv4 peer's is its address in hex; an IPv6 peer keeps
// the name of the tunnel it has, or gets the first free one of its hash
// candidates (peerNames), so no two peers share one.
func (r *Router) SyncPeers(peers []netip.Addr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("egress router: closed")
	}
	var valid []netip.Addr
	seen := map[netip.Addr]bool{}
	var errs []error
	for _, p := range peers {
		p = p.Unmap()
		if !p.IsValid() || p.IsUnspecified() || p.Zone() != "" {
			errs = append(errs, fmt.Errorf("peer %q: not a unicast address: %w", p, ErrInvalid))
			continue
		}
		if (p.Is4() && !r.cfg.Local4.IsValid()) || (p.Is6() && !r.cfg.Local6.IsValid()) {
			errs = append(errs, fmt.Errorf("peer %s: the router has no local address of its family: %w", p, ErrInvalid))
			continue
		}
		if !seen[p] {
			seen[p] = true
			valid = append(valid, p)
		}
	}
	found, err := listTunnels(r.h, routerPrefix4, routerPrefix6)
	if err != nil {
		return fmt.Errorf("egress router sync: %w", err)
	}
	cur, foreign := found.ours, found.foreign
	remotes := make(map[string]netip.Addr, len(cur))
	for name, t := range cur {
		remotes[name] = t.remote
	}
	taken := make(map[string]bool, len(foreign))
	for name := range foreign {
		taken[name] = true
	}
	names, err := peerNames(valid, remotes, taken)
	if err != nil {
		errs = append(errs, err)
	}
	want := map[string]tunnel{}
	for _, p := range valid {
		if n := names[p]; n != "" {
			want[n] = r.tunnelFor(p, n)
		}
	}
	old := r.peers
	r.peers = map[netip.Addr]bool{}
	var made []tunnel
	for name, t := range want {
		if err := r.ensurePeer(t, cur, foreign[name] != ""); err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", t.remote, err))
			continue
		}
		r.peers[t.remote] = true
		made = append(made, t)
	}
	for name, t := range cur {
		if _, ok := want[name]; ok {
			continue
		}
		if err := delLink(r.h, name); err != nil {
			errs = append(errs, err)
		}
		if !seen[t.remote] {
			r.unflushed[t.remote] = true
		}
	}
	for p := range old {
		if !seen[p] {
			r.unflushed[p] = true
		}
	}
	// The peer sets after the tunnels: a new peer's packets pass once
	// both are there; a removed one's device is gone already.
	v4, v6 := peerElements(made)
	if err := replaceSets(r.nft, map[string][]nftables.SetElement{"peers4": v4, "peers6": v6}); err != nil {
		errs = append(errs, err)
	}
	if err := r.flushConntrack(seen); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("egress router sync: %w", err)
	}
	return nil
}

// flushConntrack deletes the conntrack entries whose original source is
// a peer in r.unflushed (unless keep has it again), and forgets the peers
// done.
func (r *Router) flushConntrack(keep map[netip.Addr]bool) error {
	for p := range r.unflushed {
		if keep[p] {
			delete(r.unflushed, p)
		}
	}
	if len(r.unflushed) == 0 {
		return nil
	}
	var errs []error
	for _, v6 := range []bool{false, true} {
		f := origSource{}
		for p := range r.unflushed {
			if p.Is6() == v6 {
				f[p] = true
			}
		}
		if len(f) == 0 {
			continue
		}
		fam := netlink.InetFamily(unix.AF_INET)
		if v6 {
			fam = unix.AF_INET6
		}
		if _, err := r.h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil {
			errs = append(errs, fmt.Errorf("delete conntrack entries of removed peers: %w", err))
			continue
		}
		for p := range f {
			delete(r.unflushed, p)
		}
	}
	return errors.Join(errs...)
}

// origSource matches conntrack entries by their original source address.
type origSource map[netip.Addr]bool

func (f origSource) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	return f[addrOf(flow.Forward.SrcIP)]
}

// SyncDestinations sets the destinations the router forwards to from its
// tunnels: the Egress's spec.destinations (both families in one list;
// overlaps are merged) as a client routes them (routerDestRanges: never
// link-local, and a default route without the private ranges). Anything
// else a client sends is dropped. A malformed prefix is an ErrInvalid and
// changes nothing. The change is atomic: a packet sees the old list or
// the new.
func (r *Router) SyncDestinations(dsts []netip.Prefix) error {
	v4, v6, err := routerDestRanges(dsts)
	if err != nil {
		return fmt.Errorf("egress router destinations: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("egress router: closed")
	}
	if err := replaceSets(r.nft, map[string][]nftables.SetElement{"dests4": rangeElements(v4), "dests6": rangeElements(v6)}); err != nil {
		return fmt.Errorf("egress router destinations: %w", err)
	}
	return nil
}

func (r *Router) ensurePeer(t tunnel, cur map[string]tunnel, foreign bool) error {
	if old, ok := cur[t.name]; ok && old != t {
		if err := delLink(r.h, t.name); err != nil {
			return err
		}
		delete(cur, t.name)
	}
	if _, ok := cur[t.name]; !ok {
		var j journal // the device goes again if its route cannot be made
		if _, err := addTunnel(r.h, t, foreign, &j); err != nil {
			return err
		}
		if err := replaceRoute(r.h, route{table: RouterTable, dst: netip.PrefixFrom(t.remote, t.remote.BitLen()), dev: t.name}); err != nil {
			_ = j.undo()
			return err
		}
		return nil
	}
	// Present and equal: make sure the route is there too.
	return replaceRoute(r.h, route{table: RouterTable, dst: netip.PrefixFrom(t.remote, t.remote.BitLen()), dev: t.name})
}

// Stats reads the router's counters from the kernel.
func (r *Router) Stats() (RouterStats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return RouterStats{}, errors.New("egress router: closed")
	}
	var s RouterStats
	s.Peers = len(r.peers)
	ts, err := listTunnels(r.h, routerPrefix4, routerPrefix6)
	if err != nil {
		return s, fmt.Errorf("egress router stats: %w", err)
	}
	s.Tunnels = len(ts.ours)
	for _, v6 := range r.families() {
		fam := uint8(unix.AF_INET)
		if v6 {
			fam = unix.AF_INET6
		}
		n, err := countSNAT(r.ct, fam, r.peers)
		if err != nil {
			return s, fmt.Errorf("egress router stats: %w", err)
		}
		s.ConntrackEntries += n
	}
	cs, err := nftCounters(r.nft)
	if err != nil {
		return s, fmt.Errorf("egress router stats: %w", err)
	}
	s.Packets = cs[tagOut].Packets + cs[tagIn].Packets
	s.Bytes = cs[tagOut].Bytes + cs[tagIn].Bytes
	s.NATConnections = cs[tagMasq].Packets
	s.DroppedSource = cs[tagDropSrc4].Packets + cs[tagDropSrc6].Packets
	s.DroppedDestination = cs[tagDropDst4].Packets + cs[tagDropDst6].Packets
	return s, nil
}

// Peers returns the peers that have a tunnel, sorted.
func (r *Router) Peers() []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]netip.Addr, 0, len(r.peers))
	for p := range r.peers {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// Close removes everything the router made (tunnels with their routes,
// the policy rules, the nftables table, the FoU ports) and releases its
// sockets. Sysctls stay as set. A second Close does nothing.
func (r *Router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	if ts, err := listTunnels(r.h, routerPrefix4, routerPrefix6); err != nil {
		errs = append(errs, err)
	} else {
		for name := range ts.ours {
			errs = append(errs, delLink(r.h, name))
		}
	}
	if have, err := findRules(r.h, r.rules()); err != nil {
		errs = append(errs, err)
	} else {
		for x := range have {
			if err := r.h.RuleDel(x.nl()); err != nil {
				errs = append(errs, fmt.Errorf("delete rule pref %d: %w", x.prio, err))
			}
		}
	}
	errs = append(errs, removeNFT(r.nft))
	if have, err := listFoU(r.h); err != nil {
		errs = append(errs, err)
	} else {
		for _, v6 := range r.families() {
			f := fouPort{v6: v6, port: r.cfg.Port}
			if have[f] {
				if err := r.h.FouDel(f.nl()); err != nil {
					errs = append(errs, fmt.Errorf("delete fou port %d: %w", f.port, err))
				}
			}
		}
	}
	_ = r.nft.CloseLasting()
	r.h.Close()
	r.ct.Close()
	r.peers = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("egress router close: %w", err)
	}
	return nil
}

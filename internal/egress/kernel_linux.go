package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// openHandle returns a netlink handle whose sockets (route, generic for
// FoU, and netfilter for conntrack when asked) live in the namespace at
// path. Every family must have its socket in the handle: for a protocol
// it lacks, the library would open a socket in whatever namespace the
// calling thread happens to be in.
func openHandle(path string, conntrack bool) (*netlink.Handle, error) {
	h, _, err := openHandleSysctls(path, conntrack, nil)
	return h, err
}

// openHandleSysctls is openHandle that also sets sysctls (see
// swapSysctls) in the same namespace switch, returning their old values.
func openHandleSysctls(path string, conntrack bool, kv [][2]string) (*netlink.Handle, [][2]string, error) {
	h, _, old, err := openHandles(path, conntrack, kv, false)
	return h, old, err
}

// openHandles is openHandleSysctls that also opens, when raw is set, a
// route socket of the namespace of its own for batched requests (see
// addRules), in the same switch: a switch costs more than a socket.
func openHandles(path string, conntrack bool, kv [][2]string, raw bool) (*netlink.Handle, *routeSocket, [][2]string, error) {
	protos := []int{unix.NETLINK_ROUTE, unix.NETLINK_GENERIC}
	if conntrack {
		protos = append(protos, unix.NETLINK_NETFILTER)
	}
	var h *netlink.Handle
	var s *routeSocket
	var old [][2]string
	err := netns.Do(path, func() error {
		var err error
		if h, err = netlink.NewHandle(protos...); err != nil {
			return err
		}
		if raw {
			if s, err = openRouteSocket(); err != nil {
				h.Close()
				h = nil
				return err
			}
		}
		if old, err = swapHere(kv); err != nil {
			_, _ = swapHere(old)
			h.Close()
			h = nil
			if s != nil {
				s.Close()
				s = nil
			}
		}
		return err
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("netlink handle in %q: %w", path, err)
	}
	return h, s, old, nil
}

var fouMu sync.Mutex

// requireFoU fails with ErrNotSupported when the kernel has no fou
// module (its generic netlink family is global, so asking in any
// namespace answers for all).
//
// The library caches the family's ID in a package variable without a
// lock; asking under fouMu, before any other FoU call, keeps concurrent
// first calls (skeind attaching pods in parallel) from racing on it.
func requireFoU() error {
	fouMu.Lock()
	defer fouMu.Unlock()
	if _, err := netlink.FouFamilyId(); err != nil {
		return fmt.Errorf("fou module not available (generic netlink family %q: %v): %w", netlink.FOU_GENL_NAME, err, ErrNotSupported)
	}
	return nil
}

// unsupported turns the kernel's answer to a tunnel of an unknown kind
// into ErrNotSupported naming the module.
func unsupported(err error, t tunnel) error {
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EAFNOSUPPORT) {
		mod := "ipip"
		if t.v6 {
			mod = "ip6_tunnel"
		}
		return fmt.Errorf("%s module not available (create %s: %v): %w", mod, t.name, err, ErrNotSupported)
	}
	// An ip6tnl device with FoU encapsulation needs fou6, which nothing
	// loads on demand: without it the kernel only says EINVAL.
	if t.v6 && !t.flow && errors.Is(err, unix.EINVAL) && moduleMissing("fou6") {
		return fmt.Errorf("fou6 module not available (create %s with FoU encapsulation: %v; modprobe fou6): %w", t.name, err, ErrNotSupported)
	}
	return err
}

// moduleMissing reports whether /sys/module lists no module name (false
// when /sys/module cannot be read: then nothing is known).
func moduleMissing(name string) bool {
	if _, err := os.Stat("/sys/module"); err != nil {
		return false
	}
	_, err := os.Stat("/sys/module/" + name)
	return errors.Is(err, os.ErrNotExist)
}

func ipOf(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return net.IP(a.AsSlice())
}

func addrOf(ip net.IP) netip.Addr {
	if ip == nil {
		return netip.Addr{}
	}
	if v4 := ip.To4(); v4 != nil {
		a, _ := netip.AddrFromSlice(v4)
		return a
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}

func ipNet(p netip.Prefix) *net.IPNet {
	if !p.IsValid() {
		return nil
	}
	return &net.IPNet{IP: ipOf(p.Addr()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet, v6 bool) netip.Prefix {
	if n == nil {
		if v6 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addrOf(n.IP), ones)
}

// ip6tnlIgnEncapLimit is IP6_TNL_F_IGN_ENCAP_LIMIT: no tunnel encapsulation
// limit option, whose extension header the FoU receiver would not expect
// in front of the inner packet.
const ip6tnlIgnEncapLimit = 0x1

// kind is the link type of t as the kernel reports it.
func (t tunnel) kind() string {
	if t.v6 {
		return "ip6tnl"
	}
	return "ipip"
}

// link builds the netlink object of t (created up).
func (t tunnel) link() netlink.Link {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = t.name
	attrs.Alias = t.alias
	attrs.Flags = net.FlagUp
	if t.flow {
		if t.v6 {
			return &netlink.Ip6tnl{LinkAttrs: attrs, FlowBased: true}
		}
		return &netlink.Iptun{LinkAttrs: attrs, FlowBased: true}
	}
	if t.v6 {
		return &netlink.Ip6tnl{
			LinkAttrs: attrs, Local: ipOf(t.local), Remote: ipOf(t.remote),
			Ttl: 64, Proto: unix.IPPROTO_IPV6, Flags: ip6tnlIgnEncapLimit,
			EncapType: netlink.FOU_ENCAP_DIRECT, EncapSport: t.sport, EncapDport: t.dport,
		}
	}
	return &netlink.Iptun{
		LinkAttrs: attrs, Local: ipOf(t.local), Remote: ipOf(t.remote),
		Ttl: 64, PMtuDisc: 1,
		EncapType: netlink.FOU_ENCAP_DIRECT, EncapSport: t.sport, EncapDport: t.dport,
	}
}

// tunnelOf reads a link back as a tunnel of ours; ok is false when the
// link is not one (another kind, or without our alias tag).
func tunnelOf(l netlink.Link) (t tunnel, ok bool) {
	a := l.Attrs()
	if !strings.HasPrefix(a.Alias, aliasPrefix) {
		return tunnel{}, false
	}
	t.name, t.alias = a.Name, a.Alias
	switch x := l.(type) {
	case *netlink.Iptun:
		t.flow = x.FlowBased
		t.remote, t.local = addrOf(x.Remote), addrOf(x.Local)
		t.sport, t.dport = x.EncapSport, x.EncapDport
	case *netlink.Ip6tnl:
		t.v6 = true
		t.flow = x.FlowBased
		t.remote, t.local = addrOf(x.Remote), addrOf(x.Local)
		t.sport, t.dport = x.EncapSport, x.EncapDport
	default:
		return tunnel{}, false
	}
	if t.flow {
		t.remote, t.local, t.sport, t.dport = netip.Addr{}, netip.Addr{}, 0, 0
	}
	return t, true
}

// isOurName reports whether name has one of the prefixes given.
func isOurName(name string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// tunnels is what listTunnels found.
type tunnels struct {
	ours    map[string]tunnel
	foreign map[string]string // our names on links that are not ours -> their kind
	index   map[int]string    // link index -> name, of ours
}

// listTunnels returns our tunnels among the links whose names carry one of
// prefixes, and the names (with kinds) of foreign links among them.
func listTunnels(h *netlink.Handle, prefixes ...string) (tunnels, error) {
	links, err := redump(h.LinkList)
	if err != nil {
		return tunnels{}, fmt.Errorf("list links: %w", err)
	}
	ts := tunnels{ours: map[string]tunnel{}, foreign: map[string]string{}, index: map[int]string{}}
	for _, l := range links {
		name := l.Attrs().Name
		if !isOurName(name, prefixes...) {
			continue
		}
		if t, ok := tunnelOf(l); ok {
			ts.ours[name] = t
			ts.index[l.Attrs().Index] = name
		} else {
			ts.foreign[name] = l.Type()
		}
	}
	return ts, nil
}

func nlFamily(v6 bool) int {
	if v6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

func (r rule) nl() *netlink.Rule {
	x := netlink.NewRule()
	x.Priority = r.prio
	x.Family = nlFamily(r.v6)
	x.Table = r.table
	x.Dst = ipNet(r.dst)
	x.IifName = r.iif
	return x
}

// routeSocket is a plain rtnetlink socket (blocking; the kernel has
// queued every answer by the time the send returns).
type routeSocket struct {
	fd  int
	buf []byte
}

// openRouteSocket opens a route socket in the calling thread's namespace.
func openRouteSocket() (*routeSocket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("route socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind route socket: %w", err)
	}
	return &routeSocket{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (s *routeSocket) Close() error { return unix.Close(s.fd) }

// receive reads one datagram of messages from the kernel.
func (s *routeSocket) receive() ([]syscall.NetlinkMessage, error) {
	for {
		n, from, err := unix.Recvfrom(s.fd, s.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not from the kernel
		}
		return syscall.ParseNetlinkMessage(s.buf[:n])
	}
}

// addRules adds rs (none of which may exist yet) in one request of
// several messages on s, a route socket of the namespace: the kernel
// handles and acknowledges each in turn, the same as one RuleAdd each,
// but in a single round trip. It returns the rules that were added, also
// on error (the first failure, in the order of rs); when the answers
// cannot be read, every rule is returned as maybe added.
func addRules(s *routeSocket, rs []rule) ([]rule, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	var buf []byte
	bySeq := map[uint32]int{}
	for i, r := range rs {
		req := nl.NewNetlinkRequest(unix.RTM_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
		msg := nl.NewRtMsg()
		msg.Family = uint8(nlFamily(r.v6))
		msg.Protocol = unix.RTPROT_BOOT
		msg.Scope = unix.RT_SCOPE_UNIVERSE
		msg.Type = unix.RTN_UNICAST // FR_ACT_TO_TBL
		msg.Table = unix.RT_TABLE_UNSPEC
		if r.table < 256 {
			msg.Table = uint8(r.table)
		}
		var attrs []*nl.RtAttr
		if r.dst.IsValid() {
			msg.Dst_len = uint8(r.dst.Bits())
			attrs = append(attrs, nl.NewRtAttr(unix.RTA_DST, r.dst.Addr().AsSlice()))
		}
		attrs = append(attrs, nl.NewRtAttr(nl.FRA_PRIORITY, nl.Uint32Attr(uint32(r.prio))))
		if r.table >= 256 {
			attrs = append(attrs, nl.NewRtAttr(nl.FRA_TABLE, nl.Uint32Attr(uint32(r.table))))
		}
		if r.iif != "" {
			attrs = append(attrs, nl.NewRtAttr(nl.FRA_IIFNAME, []byte(r.iif+"\x00")))
		}
		req.AddData(msg)
		for _, a := range attrs {
			req.AddData(a)
		}
		bySeq[req.Seq] = i
		buf = append(buf, req.Serialize()...)
	}
	if err := unix.Sendto(s.fd, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("add %d rules: %w", len(rs), err)
	}
	errs := make([]error, len(rs))
	acked := 0
	for acked < len(rs) {
		msgs, err := s.receive()
		if err != nil {
			return rs, fmt.Errorf("add %d rules: read the answers: %w", len(rs), err)
		}
		for _, m := range msgs {
			i, ok := bySeq[m.Header.Seq]
			if !ok || m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			delete(bySeq, m.Header.Seq)
			acked++
			if errno := -int32(nl.NativeEndian().Uint32(m.Data[:4])); errno != 0 {
				errs[i] = unix.Errno(errno)
			}
		}
	}
	var added []rule
	var first error
	for i, r := range rs {
		if errs[i] == nil {
			added = append(added, r)
		} else if first == nil {
			first = fmt.Errorf("add rule pref %d: %w", r.prio, errs[i])
		}
	}
	return added, first
}

// dumpTries is how often a dump is taken when the kernel marks it
// interrupted (NLM_F_DUMP_INTR: the table changed while it was read, as
// IPv6 configuring a new pod's interface makes its addresses change
// during the ADD) before the call fails.
const dumpTries = 8

// redump runs the dump fn again while the kernel reports it interrupted.
func redump[T any](fn func() (T, error)) (T, error) {
	for i := 1; ; i++ {
		v, err := fn()
		if i < dumpTries && errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		return v, err
	}
}

// findRules returns which of want exist in the namespace (exactly: same
// priority, family, table, destination and input interface, nothing else).
func findRules(h *netlink.Handle, want []rule) (map[rule]bool, error) {
	return findRulesOr(h, want, nil)
}

// findRulesOr is findRules that also reports every rule for which also
// holds (nil: none), wanted or not.
func findRulesOr(h *netlink.Handle, want []rule, also func(rule) bool) (map[rule]bool, error) {
	have := map[rule]bool{}
	rs, err := redump(func() ([]netlink.Rule, error) { return h.RuleList(netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("list rules: %w", err)
	}
	for _, x := range rs {
		if x.Src != nil || x.Mark != 0 || x.Invert || x.OifName != "" || x.Goto > 0 {
			continue
		}
		v6 := x.Family == netlink.FAMILY_V6
		var dst netip.Prefix
		if x.Dst != nil {
			dst = prefixOf(x.Dst, v6)
		}
		r := rule{prio: x.Priority, v6: v6, dst: dst, iif: x.IifName, table: x.Table}
		if also != nil && also(r) {
			have[r] = true
			continue
		}
		for _, w := range want {
			if w == r {
				have[r] = true
			}
		}
	}
	return have, nil
}

// listRoutes returns the routes of tables whose device is one of devs
// (by index), both families, in one dump.
func listRoutes(h *netlink.Handle, tables []int, devs map[int]string) ([]route, error) {
	rs, err := redump(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var out []route
	for _, x := range rs {
		dev, ok := devs[x.LinkIndex]
		if !ok || !slices.Contains(tables, x.Table) {
			continue
		}
		out = append(out, route{table: x.Table, dst: prefixOf(x.Dst, x.Family == netlink.FAMILY_V6), dev: dev})
	}
	return out, nil
}

func (r route) nl(h *netlink.Handle) (*netlink.Route, error) {
	return r.nlAt(h, 0)
}

// nlAt is nl with the device's index known (0: look it up by name).
func (r route) nlAt(h *netlink.Handle, index int) (*netlink.Route, error) {
	if index == 0 {
		l, err := h.LinkByName(r.dev)
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", r.dev, err)
		}
		index = l.Attrs().Index
	}
	return &netlink.Route{
		LinkIndex: index, Table: r.table, Dst: ipNet(r.dst),
		Scope: netlink.SCOPE_LINK, Family: nlFamily(r.dst.Addr().Is6()),
	}, nil
}

func (f fouPort) nl() netlink.Fou {
	x := netlink.Fou{Family: unix.AF_INET, Port: f.port, Protocol: unix.IPPROTO_IPIP, EncapType: netlink.FOU_ENCAP_DIRECT}
	if f.v6 {
		x.Family, x.Protocol = unix.AF_INET6, unix.IPPROTO_IPV6
	}
	return x
}

// listFoU returns the FoU receive ports of the namespace that have the
// shape this package makes (direct encapsulation of the family's inner
// protocol).
func listFoU(h *netlink.Handle) (map[fouPort]bool, error) {
	fs, err := redump(func() ([]netlink.Fou, error) { return h.FouList(unix.AF_INET) })
	if err != nil {
		return nil, fmt.Errorf("list fou ports: %w", err)
	}
	out := map[fouPort]bool{}
	for _, f := range fs {
		switch {
		case f.Family == unix.AF_INET && f.Protocol == unix.IPPROTO_IPIP && f.EncapType == netlink.FOU_ENCAP_DIRECT:
			out[fouPort{port: f.Port}] = true
		case f.Family == unix.AF_INET6 && f.Protocol == unix.IPPROTO_IPV6 && f.EncapType == netlink.FOU_ENCAP_DIRECT:
			out[fouPort{v6: true, port: f.Port}] = true
		}
	}
	return out, nil
}

// journal records how to undo each change made so far; undo runs them in
// reverse order. It is how ApplyClient leaves a namespace as it found it
// when a step fails.
type journal struct{ undos []func() error }

func (j *journal) add(undo func() error) { j.undos = append(j.undos, undo) }

func (j *journal) undo() error {
	var errs []error
	for i := len(j.undos) - 1; i >= 0; i-- {
		if err := j.undos[i](); err != nil {
			errs = append(errs, err)
		}
	}
	j.undos = nil
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrUndoFailed, errors.Join(errs...))
	}
	return nil
}

// ensureSysctls makes each sysctl (name, value) inside the namespace at
// path ("" = the current one) have its value, in one switch, writing only
// those that differ: a pod whose /proc/sys is read-only (one without
// privileges) works when the values are set for it beforehand. Names are
// dotted ("net.ipv4.ip_forward") or, with a slash, paths below /proc/sys.
// A name that does not exist is an error.
func ensureSysctls(path string, kv [][2]string) error {
	return netns.Do(path, func() error {
		for _, p := range kv {
			name := p[0]
			if !strings.Contains(name, "/") {
				name = strings.ReplaceAll(name, ".", "/")
			}
			file := "/proc/sys/" + name
			b, err := os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("read sysctl %s: %w", p[0], err)
			}
			if strings.TrimSpace(string(b)) == p[1] {
				continue
			}
			if err := os.WriteFile(file, []byte(p[1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s (it is %s; where /proc/sys is read-only, set it for the pod beforehand): %w",
					p[0], p[1], strings.TrimSpace(string(b)), err)
			}
		}
		return nil
	})
}

// swapSysctls writes each (name, value) inside the namespace at path in
// one switch and returns the values they had before; names are paths
// below /proc/sys. A name that does not exist is skipped.
func swapSysctls(path string, kv [][2]string) ([][2]string, error) {
	var old [][2]string
	err := netns.Do(path, func() error {
		var err error
		old, err = swapHere(kv)
		return err
	})
	return old, err
}

// swapHere is swapSysctls in the calling thread's namespace.
func swapHere(kv [][2]string) ([][2]string, error) {
	var old [][2]string
	for _, p := range kv {
		file := "/proc/sys/" + p[0]
		b, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return old, fmt.Errorf("read sysctl %s: %w", p[0], err)
		}
		cur := strings.TrimSpace(string(b))
		if cur == p[1] {
			continue
		}
		if err := os.WriteFile(file, []byte(p[1]), 0o644); err != nil {
			return old, fmt.Errorf("sysctl %s=%s: %w", p[0], p[1], err)
		}
		old = append(old, [2]string{p[0], cur})
	}
	return old, nil
}

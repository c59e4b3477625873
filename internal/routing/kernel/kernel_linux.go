package kernel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/routing"
)

// KernelConfig configures a Kernel. Every zero value means the documented
// default, which NewKernel fills in.
type KernelConfig struct {
	// Mode is what Sync installs. Default ModeExport (nothing).
	Mode routing.Mode
	// NodeNetNS is the path of the node's network namespace; "" means the
	// namespace the process runs in.
	NodeNetNS string
	// Table holds the routes to remote blocks. Default 120. Not a kernel
	// table (253..255) nor one of the dataplane's (116..119).
	Table int
	// Protocol is the rtm_protocol that tags the routes Sync makes; routes
	// in Table with another protocol are never touched. Default 32; 5..255,
	// not the dataplane's 30 or 31.
	Protocol int
	// RulePriority is the priority of the rules "from all lookup Table"
	// (both families, tagged Protocol) of the direct and vxlan modes.
	// Default 2001.
	RulePriority int
	// LocalAddrs are this node's underlay addresses, at most one per
	// family; only the vxlan mode uses (and checks) them, and needs one.
	// The tunnel's local end is UnderlayAddr(LocalAddrs): the IPv4 address
	// if there is one, else the IPv6 one; that decides the underlay's
	// family. SetLocalAddrs changes them later.
	LocalAddrs []netip.Addr
	// VXLAN configures the vxlan mode's device.
	VXLAN VXLANConfig
}

// VXLANConfig configures the VXLAN device. Zero values mean the defaults.
type VXLANConfig struct {
	// Device is the link's name. Default "skein.vxlan".
	Device string
	// VNI is the VXLAN network identifier, 1..2^24-1. Default 4100.
	VNI int
	// Port is the UDP destination port. Default 4789.
	Port int
	// MTU of the device and so of the pods' traffic between nodes. 0 means
	// the MTU of the underlay link (the one holding the local address)
	// minus the VXLAN overhead of the underlay's family (see PodMTU).
	MTU int
}

// deviceAlias marks the VXLAN device as skein's: a link of the configured
// name without it is someone else's and is never modified or deleted.
const deviceAlias = "skein:routing:vxlan"

// Kernel installs routes to other nodes' blocks in one node namespace. Its
// methods may be called from several goroutines; Sync and Uninstall run one
// at a time.
type Kernel struct {
	cfg   KernelConfig
	local []netip.Addr // LocalAddrs, as last set (SetLocalAddrs); under mu
	// oldRulesGone: the untagged rules of skeind versions before the rule
	// carried Protocol were looked for (once per Kernel); under mu.
	oldRulesGone bool
	// last is what the last successful Sync left, kept by Update; nil
	// until then and after a failure (Update then wants a Sync); under mu.
	last   *applied
	h      *netlink.Handle
	closeH func()
	mu     sync.Mutex
}

// NewKernel validates cfg, fills its defaults and opens a netlink socket in
// the node namespace. It changes nothing in the kernel.
func NewKernel(cfg KernelConfig) (*Kernel, error) {
	setKernelDefaults(&cfg)
	if err := validateKernelConfig(cfg); err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	if cfg.NodeNetNS != "" {
		if err := netns.IsNetNS(cfg.NodeNetNS); err != nil {
			return nil, fmt.Errorf("routing: %w", err)
		}
	}
	h, closeH, err := netns.Handle(cfg.NodeNetNS)
	if err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	return &Kernel{cfg: cfg, local: slices.Clone(cfg.LocalAddrs), h: h, closeH: closeH}, nil
}

// SetLocalAddrs replaces this node's underlay addresses (KernelConfig's
// LocalAddrs), checked the same way, for the next Sync: in vxlan mode a
// changed underlay address makes it recreate the device with the new
// local end. Invalid addresses are refused and change nothing.
func (k *Kernel) SetLocalAddrs(addrs []netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cfg.Mode == routing.ModeVXLAN {
		if err := validateLocalAddrs(addrs); err != nil {
			return fmt.Errorf("routing: %w", err)
		}
	}
	k.local = slices.Clone(addrs)
	return nil
}

// Config returns the configuration with defaults filled in.
func (k *Kernel) Config() KernelConfig { return k.cfg }

// Close releases the netlink socket. It changes nothing in the kernel.
func (k *Kernel) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closeH != nil {
		k.closeH()
		k.closeH = nil
	}
	return nil
}

func setKernelDefaults(c *KernelConfig) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Mode == "" {
		c.Mode = routing.ModeExport
	}
	def(&c.Table, routing.DefaultTable)
	def(&c.Protocol, routing.DefaultProtocol)
	def(&c.RulePriority, routing.DefaultRulePriority)
	def(&c.VXLAN.VNI, routing.DefaultVXLANVNI)
	def(&c.VXLAN.Port, routing.DefaultVXLANPort)
	if c.VXLAN.Device == "" {
		c.VXLAN.Device = routing.DefaultVXLANDevice
	}
}

func validateKernelConfig(c KernelConfig) error {
	if _, err := routing.ParseMode(string(c.Mode)); err != nil {
		return fmt.Errorf("%w: %w", err, routing.ErrInvalid)
	}
	switch {
	case c.Table < 0 || int64(c.Table) > 1<<32-1:
		return fmt.Errorf("table %d out of range: %w", c.Table, routing.ErrInvalid)
	case c.Table == unix.RT_TABLE_MAIN || c.Table == unix.RT_TABLE_LOCAL || c.Table == unix.RT_TABLE_DEFAULT:
		return fmt.Errorf("table %d is a kernel table: %w", c.Table, routing.ErrInvalid)
	case c.Table >= 116 && c.Table <= 119:
		return fmt.Errorf("table %d is one of the dataplane's (116..119): %w", c.Table, routing.ErrInvalid)
	case c.Protocol <= unix.RTPROT_STATIC || c.Protocol > 255:
		return fmt.Errorf("route protocol %d out of range 5..255: %w", c.Protocol, routing.ErrInvalid)
	case c.Protocol == 30 || c.Protocol == 31:
		return fmt.Errorf("route protocol %d is the dataplane's (30, 31): %w", c.Protocol, routing.ErrInvalid)
	case c.RulePriority < 1 || int64(c.RulePriority) >= 32766:
		return fmt.Errorf("rule priority %d out of range 1..32765: %w", c.RulePriority, routing.ErrInvalid)
	case c.VXLAN.VNI < 1 || c.VXLAN.VNI > 1<<24-1:
		return fmt.Errorf("vxlan vni %d out of range 1..16777215: %w", c.VXLAN.VNI, routing.ErrInvalid)
	case c.VXLAN.Port < 1 || c.VXLAN.Port > 65535:
		return fmt.Errorf("vxlan port %d out of range 1..65535: %w", c.VXLAN.Port, routing.ErrInvalid)
	case c.VXLAN.MTU != 0 && (c.VXLAN.MTU < 68 || c.VXLAN.MTU > 65535):
		return fmt.Errorf("vxlan mtu %d out of range 68..65535: %w", c.VXLAN.MTU, routing.ErrInvalid)
	case !validLinkName(c.VXLAN.Device):
		return fmt.Errorf("vxlan device name %q is not a valid link name: %w", c.VXLAN.Device, routing.ErrInvalid)
	}
	if c.Mode != routing.ModeVXLAN {
		return nil // only vxlan uses them: an odd address must not stop the others
	}
	return validateLocalAddrs(c.LocalAddrs)
}

// validateLocalAddrs checks this node's underlay addresses: unicast, at
// most one per family, and at least one.
func validateLocalAddrs(addrs []netip.Addr) error {
	seen := map[bool]bool{}
	for _, a := range addrs {
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() ||
			a.IsLoopback() || a.IsLinkLocalUnicast() {
			return fmt.Errorf("local address %q is not a usable unicast address: %w", a, routing.ErrInvalid)
		}
		if seen[a.Is4()] {
			return fmt.Errorf("more than one local address of the family of %s: %w", a, routing.ErrInvalid)
		}
		seen[a.Is4()] = true
	}
	if len(addrs) == 0 {
		return fmt.Errorf("vxlan mode needs a local (underlay) address: %w", routing.ErrInvalid)
	}
	return nil
}

func validLinkName(name string) bool {
	if name == "" || len(name) > unix.IFNAMSIZ-1 || name == "." || name == ".." {
		return false
	}
	return !strings.ContainsAny(name, "/: \t\n\r\x00")
}

// Sync makes the kernel hold what the mode wants for remotes and nothing
// else of its own, and reports per remote what it applied, in the order
// given. Everything is compared first and written only where it differs, so
// a repeated Sync with the same remotes changes nothing; new and changed
// entries are written before stale ones are deleted. Only routes in Table
// tagged Protocol, the rule "from all lookup Table" at RulePriority, and the
// VXLAN device (by name, when it carries skein's alias) with its FDB and
// permanent neighbour entries are ever changed.
//
// ctx is checked before the first write of each mode (a cancelled Sync
// changes nothing); once writing, Sync runs to the end.
//
// A remote that cannot be routed (no usable node address, an unreachable
// node, a block another remote already claims, a kernel refusal of its
// route) gets Installed false and a Reason; the error is for failures of the
// whole Sync (netlink dumps, the rule, the device), after which the kernel
// may be half way and the next Sync repairs it.
func (k *Kernel) Sync(ctx context.Context, remotes []routing.Remote) ([]routing.Status, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closeH == nil {
		return nil, errors.New("routing sync: kernel closed")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("routing sync: %w", err)
	}
	var (
		st  []routing.Status
		err error
	)
	k.last = nil // set again by a mode's sync that ends well
	switch k.cfg.Mode {
	case routing.ModeDirect:
		st, err = k.syncDirect(ctx, remotes)
	case routing.ModeVXLAN:
		st, err = k.syncVXLAN(ctx, remotes)
	default:
		st, err = k.syncExport(remotes)
	}
	if err != nil {
		return st, fmt.Errorf("routing sync (%s): %w", k.cfg.Mode, err)
	}
	return st, nil
}

// Uninstall removes everything any mode installed: the rules, the routes in
// Table tagged Protocol, the VXLAN device. It is idempotent.
func (k *Kernel) Uninstall() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closeH == nil {
		return errors.New("routing uninstall: kernel closed")
	}
	k.last = nil
	if err := k.removeAll(); err != nil {
		return fmt.Errorf("routing uninstall: %w", err)
	}
	return nil
}

func (k *Kernel) removeAll() error {
	if err := k.setRoutes(nil); err != nil {
		return err
	}
	if err := k.deleteDevice(); err != nil {
		return err
	}
	if err := k.deleteGuard(); err != nil {
		return err
	}
	return k.setRules(false)
}

// syncExport removes what the other modes left and reports, per remote,
// whether a routing daemon installed a route for exactly its block in some
// other table.
func (k *Kernel) syncExport(remotes []routing.Remote) ([]routing.Status, error) {
	if err := k.removeAll(); err != nil {
		return nil, err
	}
	routes, err := k.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	have := map[netip.Prefix]netip.Addr{}
	for _, r := range routes {
		if r.Table == k.cfg.Table || r.Type != unix.RTN_UNICAST || r.Dst == nil {
			continue
		}
		p, ok := prefixOf(r.Dst)
		if !ok {
			continue
		}
		if _, dup := have[p]; !dup || !have[p].IsValid() {
			have[p] = nextHop(r)
		}
	}
	out := make([]routing.Status, len(remotes))
	for i, rm := range remotes {
		out[i].Remote = rm
		via, ok := have[rm.Block]
		if !ok {
			out[i].Reason = "no route for the block (export mode: a routing daemon must install it)"
			continue
		}
		out[i].Installed, out[i].Via = true, via
	}
	return out, nil
}

// setRules adds (want) or removes the rules "from all lookup Table" at
// RulePriority tagged Protocol in both families, writing only when the
// kernel differs. The first call also removes the same rules without a
// protocol, which skeind made before it tagged them.
func (k *Kernel) setRules(want bool) error {
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := k.h.RuleList(family)
		if err != nil {
			if family == netlink.FAMILY_V6 && errors.Is(err, unix.EAFNOSUPPORT) {
				continue
			}
			return fmt.Errorf("list rules: %w", err)
		}
		if !k.oldRulesGone {
			if rules, err = k.deleteOldRules(family, rules); err != nil {
				return err
			}
		}
		n := 0
		for _, r := range rules {
			if k.isOurRule(r) {
				n++
			}
		}
		switch {
		case want && n == 0:
			if err := k.h.RuleAdd(k.rule(family)); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("add rule family %d prio %d lookup %d: %w", family, k.cfg.RulePriority, k.cfg.Table, err)
			}
		case !want:
			for ; n > 0; n-- {
				if err := k.h.RuleDel(k.rule(family)); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("delete rule family %d prio %d: %w", family, k.cfg.RulePriority, err)
				}
			}
		}
	}
	k.oldRulesGone = true
	return nil
}

// deleteOldRules deletes the untagged rules "from all lookup Table" at
// RulePriority (skeind's before the protocol tag) and returns the rules
// left. A delete without a protocol removes the first rule of that shape
// in the kernel's order, whatever its protocol; so an untagged rule is
// deleted only while it is the first of its shape (an upgrade finds only
// untagged ones), never one behind another owner's tagged rule.
func (k *Kernel) deleteOldRules(family int, rules []netlink.Rule) ([]netlink.Rule, error) {
	for range len(rules) {
		i := slices.IndexFunc(rules, k.isRuleShape)
		if i < 0 || rules[i].Protocol != unix.RTPROT_UNSPEC {
			return rules, nil
		}
		r := k.rule(family)
		r.Protocol = unix.RTPROT_UNSPEC
		if err := k.h.RuleDel(r); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("delete untagged rule family %d prio %d: %w", family, k.cfg.RulePriority, err)
		}
		var err error
		if rules, err = k.h.RuleList(family); err != nil {
			return nil, fmt.Errorf("list rules: %w", err)
		}
	}
	return rules, nil
}

func (k *Kernel) rule(family int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = family
	r.Priority = k.cfg.RulePriority
	r.Table = k.cfg.Table
	r.Protocol = uint8(k.cfg.Protocol)
	return r
}

// isOurRule: exactly "from all lookup Table" at RulePriority, no
// selectors, tagged Protocol (an administrator's identical rule with
// another protocol is not ours).
func (k *Kernel) isOurRule(r netlink.Rule) bool {
	return r.Protocol == uint8(k.cfg.Protocol) && k.isRuleShape(r)
}

// isRuleShape: "from all lookup Table" at RulePriority, no selectors.
func (k *Kernel) isRuleShape(r netlink.Rule) bool {
	return r.Priority == k.cfg.RulePriority && r.Table == k.cfg.Table && r.Src == nil && r.Dst == nil &&
		r.Mark == 0 && r.IifName == "" && r.OifName == "" && !r.Invert && r.Goto <= 0 &&
		(r.Type == 0 || r.Type == unix.FR_ACT_TO_TBL)
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// nextHop is the route's gateway (or RTA_VIA; the first path's of a
// multipath route), invalid when it has none.
func nextHop(r netlink.Route) netip.Addr {
	if r.Gw != nil {
		return addrOf(r.Gw)
	}
	if len(r.MultiPath) > 0 && r.MultiPath[0].Gw != nil {
		return addrOf(r.MultiPath[0].Gw)
	}
	if v, ok := r.Via.(*netlink.Via); ok && v != nil {
		return addrOf(v.Addr)
	}
	return netip.Addr{}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// addrOfFamily returns the first address in addrs of a's family.
func addrOfFamily(addrs []netip.Addr, v4 bool) netip.Addr {
	for _, a := range addrs {
		if a.Unmap().Is4() == v4 {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

// validBlock: a canonical prefix without zone.
func validBlock(p netip.Prefix) bool {
	return p.IsValid() && p.Addr().Zone() == "" && !p.Addr().Is4In6() && p == p.Masked()
}

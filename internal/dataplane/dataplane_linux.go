package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/netns"
)

// Config configures a Dataplane. Every zero value means the documented
// default, which New fills in.
type Config struct {
	// NodeNetNS is the path of the node's network namespace; "" means the
	// namespace the process runs in (production). Tests set a path.
	NodeNetNS string
	// PodTable holds the per-pod host routes. Default 116.
	PodTable int
	// RulePriority is the priority of the "from all lookup PodTable" rule,
	// installed for IPv4 and IPv6. Default 2000.
	RulePriority int
	// ExportTable holds the block routes a routing daemon (BIRD) exports.
	// Default 119.
	ExportTable int
	// ExportProto is the rtm_protocol of exported block routes. Default 30.
	ExportProto int
	// PodRouteProto is the rtm_protocol that tags per-pod routes in PodTable.
	// Default 31 (unassigned in iproute2's rt_protos; above RTPROT_STATIC,
	// so the kernel does not interpret it).
	PodRouteProto int
	// GatewayV4 is the pods' IPv4 gateway. Default 169.254.1.1. It is on
	// no interface: Init makes it one local route of the node (table
	// local, tagged PodRouteProto) and host veths answer ARP for it. Putting
	// the same address on every host veth would make each new veth cost
	// O(attachments) in the kernel's address hash.
	GatewayV4 netip.Addr
	// GatewayV6 is the IPv6 gateway of attachments made before each host
	// veth's own link-local address became its pod's gateway (see the
	// package doc): it was put, as a /64 without DAD, on every host veth,
	// which made each new veth cost O(attachments) in the kernel. New
	// attachments do not use it; Check accepts it on links that still
	// carry it, and front doors hand it out for such links. Default
	// fe80::1.
	GatewayV6 netip.Addr
	// MTU of new veth pairs when a Link does not set one. 0 means the MTU of
	// the node's uplink (the link of the default route in NodeNetNS, IPv4
	// first), 1500 if there is no default route. Resolved once, in New.
	MTU int
	// AliasPrefix starts the alias of every host veth skein owns. Default
	// "skein:".
	AliasPrefix string
	// NodeForwarding makes Init set net.ipv4.ip_forward=1 and
	// net.ipv6.conf.all.forwarding=1 in NodeNetNS. Off by default: a node
	// agent should not flip host-wide switches unless asked. IPv6 pod
	// traffic needs it on kernels older than 6.17 (see the package doc).
	NodeForwarding bool
}

// Defaults for the zero values of Config.
const (
	DefaultPodTable      = 116
	DefaultRulePriority  = 2000
	DefaultExportTable   = 119
	DefaultExportProto   = 30
	DefaultPodRouteProto = 31
	DefaultAliasPrefix   = "skein:"
	fallbackMTU          = 1500
)

var (
	DefaultGatewayV4 = netip.MustParseAddr("169.254.1.1")
	DefaultGatewayV6 = netip.MustParseAddr("fe80::1")
)

// Sentinel errors; test with errors.Is.
var (
	// ErrNetNSNotExist: the pod namespace path does not exist.
	ErrNetNSNotExist = netns.ErrNotExist
	// ErrNotNetNS: the path exists but is not a network namespace.
	ErrNotNetNS = netns.ErrNotNetNS
	// ErrLinkExists: Setup found the host veth name or the container
	// interface name taken; the existing link was left alone.
	ErrLinkExists = errors.New("link already exists")
	// ErrInvalid: the Config or Link is malformed (names, addresses, MTU).
	// Nothing was changed.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotOwned: a link by that name exists but does not carry skein's
	// alias tag, so Teardown refused to delete it.
	ErrNotOwned = errors.New("link not owned by skein")
	// ErrMismatch: Check found the kernel state different from the Link.
	ErrMismatch = errors.New("dataplane state does not match")
	// ErrUndoFailed: Setup or SetupPair failed and could not delete what
	// it had created: the pair, and the routes to its addresses, may
	// still exist. The addresses must stay held until a Teardown succeeds.
	ErrUndoFailed = errors.New("undo failed; the link may remain")
)

// Error is returned by every Dataplane method: the operation, the host-side
// link it concerned (if any) and the cause.
type Error struct {
	Op   string // "setup", "teardown", "check", "scan", "init", ...
	Link string // host veth name, if the operation concerned one
	Err  error
}

func (e *Error) Error() string {
	if e.Link != "" {
		return fmt.Sprintf("dataplane %s %s: %v", e.Op, e.Link, e.Err)
	}
	return fmt.Sprintf("dataplane %s: %v", e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// wrap turns a non-nil *err into an *Error; used in defers with named returns.
func wrap(err *error, op, link string) {
	if *err != nil {
		*err = &Error{Op: op, Link: link, Err: *err}
	}
}

// Dataplane programs the routed-veth dataplane of one node namespace.
type Dataplane struct {
	cfg      Config
	h        *netlink.Handle // socket in cfg.NodeNetNS, for the rare whole-node operations
	closeH   func()
	pool     handlePool // sockets for attachment operations, one per caller at a time
	unlisted unlisted   // Teardown's deletes in flight, and the links the kernel unlisted

	exportMu sync.Mutex
	exported map[netip.Prefix]bool // what SetExportedBlocks last left; nil: read the table
	mtu      int                   // resolved default MTU

	// forceForwarding6: the kernel has the per-device IPv6 force_forwarding
	// switch (Linux 6.17+). /proc/sys/net/ipv6/conf/all exists in every
	// namespace, so asking in the caller's is enough.
	forceForwarding6 bool
	// hasIPv6: the kernel has IPv6 (not booted with ipv6.disable=1).
	hasIPv6 bool
}

// New validates cfg, fills its defaults, opens a netlink socket in the node
// namespace and resolves the default MTU. It changes nothing in the kernel.
func New(cfg Config) (_ *Dataplane, retErr error) {
	defer wrap(&retErr, "new", "")
	setDefaults(&cfg)
	if err := validateConfig(cfg); err != nil {
		return nil, err
	}
	if cfg.NodeNetNS != "" {
		if err := netns.IsNetNS(cfg.NodeNetNS); err != nil {
			return nil, err
		}
	}
	h, closeH, err := netns.Handle(cfg.NodeNetNS)
	if err != nil {
		return nil, err
	}
	d := &Dataplane{cfg: cfg, h: h, closeH: closeH, mtu: cfg.MTU}
	if _, err := os.Stat("/proc/sys/net/ipv6/conf/all/force_forwarding"); err == nil {
		d.forceForwarding6 = true
	}
	if _, err := os.Stat("/proc/sys/net/ipv6/conf/all/disable_ipv6"); err == nil {
		d.hasIPv6 = true
	}
	if d.mtu == 0 {
		if d.mtu, err = d.uplinkMTU(); err != nil {
			closeH()
			return nil, err
		}
	}
	if err := d.watchUnlisted(); err != nil {
		closeH()
		return nil, err
	}
	return d, nil
}

// Config returns the configuration with defaults filled in.
func (d *Dataplane) Config() Config { return d.cfg }

// Close waits for the deletes in flight and releases the netlink sockets.
// It changes nothing in the kernel.
func (d *Dataplane) Close() error {
	d.unlisted.close()
	d.pool.close()
	if d.closeH != nil {
		d.closeH()
		d.closeH = nil
	}
	return nil
}

func setDefaults(c *Config) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.PodTable, DefaultPodTable)
	def(&c.RulePriority, DefaultRulePriority)
	def(&c.ExportTable, DefaultExportTable)
	def(&c.ExportProto, DefaultExportProto)
	def(&c.PodRouteProto, DefaultPodRouteProto)
	if !c.GatewayV4.IsValid() {
		c.GatewayV4 = DefaultGatewayV4
	}
	if !c.GatewayV6.IsValid() {
		c.GatewayV6 = DefaultGatewayV6
	}
	if c.AliasPrefix == "" {
		c.AliasPrefix = DefaultAliasPrefix
	}
}

func validateConfig(c Config) error {
	table := func(name string, t int) error {
		switch {
		case t <= 0 || int64(t) > 1<<32-1:
			return fmt.Errorf("%s %d out of range: %w", name, t, ErrInvalid)
		case t == unix.RT_TABLE_MAIN || t == unix.RT_TABLE_LOCAL || t == unix.RT_TABLE_DEFAULT:
			return fmt.Errorf("%s %d is a kernel table: %w", name, t, ErrInvalid)
		}
		return nil
	}
	if err := table("pod table", c.PodTable); err != nil {
		return err
	}
	if err := table("export table", c.ExportTable); err != nil {
		return err
	}
	switch {
	case c.PodTable == c.ExportTable:
		return fmt.Errorf("pod and export table are both %d: %w", c.PodTable, ErrInvalid)
	case c.RulePriority < 0 || int64(c.RulePriority) > 1<<32-1:
		return fmt.Errorf("rule priority %d out of range: %w", c.RulePriority, ErrInvalid)
	case c.ExportProto <= unix.RTPROT_STATIC || c.ExportProto > 255,
		c.PodRouteProto <= unix.RTPROT_STATIC || c.PodRouteProto > 255:
		return fmt.Errorf("route protocols must be in 5..255: %w", ErrInvalid)
	case c.ExportProto == c.PodRouteProto:
		return fmt.Errorf("export and pod route protocol are both %d: %w", c.ExportProto, ErrInvalid)
	case !c.GatewayV4.Is4():
		return fmt.Errorf("gateway v4 %s is not IPv4: %w", c.GatewayV4, ErrInvalid)
	case !c.GatewayV6.Is6() || c.GatewayV6.Is4In6() || !c.GatewayV6.IsLinkLocalUnicast() || c.GatewayV6.Zone() != "":
		return fmt.Errorf("gateway v6 %s must be an IPv6 link-local address without zone: %w", c.GatewayV6, ErrInvalid)
	case c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535):
		return fmt.Errorf("mtu %d out of range: %w", c.MTU, ErrInvalid)
	case len(c.AliasPrefix) > 64:
		return fmt.Errorf("alias prefix longer than 64 bytes: %w", ErrInvalid)
	}
	return nil
}

// uplinkMTU is the MTU of the link of the node's default route (IPv4 first,
// then IPv6), or 1500 when there is none.
func (d *Dataplane) uplinkMTU() (int, error) {
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := d.h.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return 0, fmt.Errorf("list main routes: %w", err)
		}
		for _, r := range routes {
			if !isDefault(r) || r.LinkIndex == 0 {
				continue
			}
			link, err := d.h.LinkByIndex(r.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("uplink %d: %w", r.LinkIndex, err)
			}
			return link.Attrs().MTU, nil
		}
	}
	return fallbackMTU, nil
}

func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

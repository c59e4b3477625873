package routing

import (
	"errors"
	"fmt"
	"net/netip"
)

// Mode is how the node reaches other nodes' blocks.
type Mode string

const (
	ModeExport Mode = "export"
	ModeDirect Mode = "direct"
	ModeVXLAN  Mode = "vxlan"
)

// ParseMode reads a --routing value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeExport, ModeDirect, ModeVXLAN:
		return m, nil
	case "":
		return ModeExport, nil
	}
	return "", fmt.Errorf("routing mode %q: want export, direct or vxlan", s)
}

// Defaults of Config's numbers. Table 116 holds pod routes, 117 and 118 are
// the egress tables of client pods, 119 the export table; remote blocks get
// 120. Protocol 30 tags exported routes, 31 pod routes, 32 remote routes.
const (
	DefaultTable        = 120
	DefaultProtocol     = 32
	DefaultRulePriority = 2001
	DefaultVXLANDevice  = "skein.vxlan"
	DefaultVXLANVNI     = 4100
	DefaultVXLANPort    = 4789
)

// VXLAN overhead on the underlay: outer Ethernet is not counted in an MTU;
// outer IP + UDP + VXLAN headers + the inner Ethernet header are.
const (
	OverheadVXLAN4 = 20 + 8 + 8 + 14 // IPv4 underlay
	OverheadVXLAN6 = 40 + 8 + 8 + 14 // IPv6 underlay
)

// ErrInvalid: a kernel configuration (internal/routing/kernel) is
// malformed. Nothing was changed.
var ErrInvalid = errors.New("invalid routing configuration")

// ErrFullSync: an Updater cannot apply a change alone (no full Sync yet, a
// mode with nothing to update, or this node's underlay address changed);
// the caller runs Sync instead.
var ErrFullSync = errors.New("routing: a full sync is needed")

// Remote is one block of another node, as the API describes it.
type Remote struct {
	// Block is one address family's slice of an AddressBlock.
	Block netip.Prefix
	// Name is the AddressBlock's name (for reports).
	Name string
	// Node is the name of the node that owns the block.
	Node string
	// NodeAddrs are the node's underlay addresses (the skein.dev/node-address
	// annotation, else its InternalIPs), at most one per family. Empty when
	// the node is unknown or has none.
	NodeAddrs []netip.Addr
}

// Status is what Sync did with one Remote.
type Status struct {
	Remote
	// Via is the next hop used: the node address (direct) or the VXLAN
	// peer's underlay address (vxlan). Invalid when not installed.
	Via netip.Addr
	// Installed: the route is in the kernel as wanted.
	Installed bool
	// Reason says why a route is not installed ("node has no address",
	// "node address 10.1.0.7 is not on a directly connected network", ...).
	Reason string
}

// UnderlayAddr picks the VXLAN underlay address out of a node's addresses:
// its IPv4 address when it has one, else its IPv6 address; the zero Addr
// when addrs is empty. Every node applies the same rule to itself and to
// its peers, whatever order the addresses are listed in.
func UnderlayAddr(addrs []netip.Addr) netip.Addr {
	var v6 netip.Addr
	for _, a := range addrs {
		if a.Is4() {
			return a
		}
		if !v6.IsValid() {
			v6 = a
		}
	}
	return v6
}

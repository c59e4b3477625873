// Package egress is the data plane of on-demand egress NAT (the Coil
// seed's Egress): client pods send chosen destinations through a
// Foo-over-UDP tunnel (IPIP for IPv4, ip6tnl for IPv6) to the ClusterIP of
// an Egress's Service, and the router pods behind that Service decapsulate,
// SNAT the traffic with nftables and tunnel the replies back.
//
// The client side (ApplyClient) runs in skeind against a pod's network
// namespace; the router side (Router) runs in skein-egress inside each
// router pod. Both are declarative: they are given the whole wanted state
// and converge the namespace to it, touching only what they made.
package egress

import "net/netip"

// DefaultPort is the FoU port on both ends. Using the same port on client
// and router is what lets kube-proxy's conntrack turn a router's reply
// back into one from the ClusterIP (the seed's "Working with Service").
const DefaultPort = 5555

// Policy-routing layout inside a client pod, as in the seed: link-local
// stays on main, specific destinations go through table 117, private
// ranges stay on main, and a default route through a gateway lives in
// table 118.
const (
	TableNarrow = 117 // destinations narrower than a default route
	TableWide   = 118 // a gateway's default route (0.0.0.0/0 or ::/0)

	PrioLinkLocal = 1800 // to link-local: main
	PrioServiceIP = 1850 // to each tunnel's ServiceIP (/32, /128): main
	PrioNarrow    = 1900 // lookup 117
	PrioPrivate   = 2000 // to each private range: main (2000, 2001, ...)
	PrioInCluster = 2010 // to each in-cluster network (ClientConfig.InCluster): main
	PrioWide      = 2100 // lookup 118
)

// Every rule at PrioServiceIP, and at a priority from PrioInCluster up to
// (not including) PrioWide, that sends a destination to the main table is
// this package's: ApplyClient removes the ones it no longer wants. The
// ServiceIP rules keep a tunnel's own encapsulated packets out of the
// gateways' tables: before table 117, so that a destination covering the
// Service range cannot catch them either, and before 118 for a default
// route when the Service range is not private (100.64.0.0/10, global
// IPv6). Without them the packets loop through their own tunnel.
const prioInClusterEnd = PrioWide

// Gateway is one Egress a client pod sends through.
type Gateway struct {
	// Namespace and Name of the Egress; the tunnel devices are named
	// after them (a hash, so any length fits IFNAMSIZ).
	Namespace, Name string
	// ServiceIPs are the Egress Service's ClusterIPs, at most one per
	// family. A family without one gets no tunnel, and that family's
	// destinations are not routed through this gateway.
	ServiceIPs []netip.Addr
	// Destinations are the Egress's spec.destinations.
	Destinations []netip.Prefix
	// Port is the FoU port (DefaultPort when 0).
	Port int
	// SourcePortAuto picks the encapsulation's UDP source port per flow
	// (better spreading over routers) instead of Port.
	SourcePortAuto bool
}

// ClientConfig is the whole egress state of one client pod. The zero
// value removes everything ApplyClient made.
type ClientConfig struct {
	Gateways []Gateway
	// InCluster are networks that never go through a gateway, such as the
	// cluster's pod pools when they are not private ranges: each gets
	// "to P lookup main" at PrioInCluster in a family that has a tunnel.
	// At most MaxInCluster; they only matter with a gateway, so without
	// one nothing is made for them.
	InCluster []netip.Prefix
}

// MaxInCluster bounds ClientConfig.InCluster (one policy rule each).
const MaxInCluster = 256

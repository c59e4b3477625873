// Package kernel is the kernel side of internal/routing (Linux only): Kernel
// programs what routing.Loop hands it (Sync: the whole wanted set, compared
// with what the kernel holds under its tags; Update: only the blocks a
// change touched, against the record of the last Sync). It owns exactly:
// routes in its table (default 120) tagged with its protocol (32), the rules
// "from all lookup 120" at priority 2001 tagged with the same protocol, and
// the VXLAN device (by name, marked by its alias; its FDB and permanent
// neighbour entries). A block for which the table already holds a route of
// another protocol is reported, not overwritten. direct routes a block via
// its node's address of the block's family, an IPv4 block via the node's
// IPv6 address if it has no IPv4 one (RTA_VIA); the address must be on a
// connected network. vxlan's underlay family is one rule for the whole
// cluster (UnderlayAddr): IPv4 when a node has an IPv4 address, else IPv6,
// for the local end and for every peer alike, so nodes listing their
// addresses in different orders still agree. Every node's device MAC is
// MACFor(its underlay address), so nothing but the addresses is exchanged.
package kernel

// Package dataplane programs skein's routed-veth dataplane through netlink:
// one veth pair per attachment, no bridge, per-pod host routes in their own
// table, and block routes exported for a routing daemon. It owns every link,
// address, route, rule and per-interface sysctl skein creates in the node's
// network namespace and the container side of each pair; it enters
// namespaces only through internal/netns.
//
// # The routing trick
//
// A pod gets its address as a /32 (/128) on its eth0, so it has no on-link
// subnet: every destination, even a pod on the same node, is reached through
// the default route, and that default route points at a link-local gateway:
// 169.254.1.1 "onlink" for IPv4, and for IPv6 the host veth's own
// link-local address. No pod ever needs to ARP for another pod or for a real
// router; it only ever resolves the gateway.
//
// The host answers for the gateway on every host-side veth, and neither
// gateway makes a new veth cost more as the node fills up. 169.254.1.1 is
// on no interface: it is one local route of the node (Init), and proxy ARP
// on each host veth answers for it. Proxy ARP additionally makes the host
// answer ARP for any address, so a runtime that imposes a wider prefix
// (Docker hands out a /24 and then ARPs for neighbours directly) still
// sends everything to the host. For IPv6 the same address on every veth
// would share one bucket of the kernel's address hash and one node of its
// routing tree, each walked in full by every new veth; so each host veth's
// gateway is its own EUI-64 link-local address (LinkLocal of the MAC Setup
// chooses), which the kernel would give it anyway. Setup installs it at
// once, without DAD (the only other address on the link is the pod's,
// from a different MAC), so that it answers neighbour solicitations and
// sources the host's own before the pod can send anything. The pod's
// default route names it, and so do the front doors: Docker Join, and a VM's
// router advertisements, which are sent from the pod's gateway address.
//
// Packets reach the host on the pod's veth and are routed like any other:
// the host holds one route per pod address, "addr dev <host veth> scope
// link", in PodTable (116), consulted through the rule "from all lookup
// PodTable" at RulePriority (2000) in both families. The host resolves the
// pod's address directly on the veth, using the gateway address as the ARP/ND
// source, and the pod answers because the address is its own. Keeping pod
// routes out of the main table keeps them apart from the node's own routing
// and makes them cheap to find (one table dump, tagged with PodRouteProto).
//
// IPv4 forwarding is enabled per host veth (conf/<veth>/forwarding), which is
// what the kernel checks on input, so the node's other interfaces are left
// alone. IPv6 has no such per-input switch before Linux 6.17: the node must
// have net.ipv6.conf.all.forwarding=1 (Config.NodeForwarding), and on 6.17+
// the host veth's force_forwarding is set so that pod traffic is forwarded
// either way.
//
// # Link events
//
// Linux walks the node's whole IPv6 routing table on several events of any
// IPv6-enabled link: a link becoming ready (carrier), a link changed while
// up without carrier (setting an alias is enough), a link going down. With
// thousands of attachments those walks dominate an ADD. So Setup creates the
// pair down, tags and addresses the host end while it is down (no events),
// brings the pod end up and then the host end, which becomes ready once,
// with its carrier; and a host veth that carries no IPv6 address gets
// disable_ipv6, so IPv4-only attachments add nothing to that table.
//
// # Tags
//
// skein recognises its own objects by tags, never by memory: host veths carry
// an alias starting with Config.AliasPrefix, pod routes carry rtm_protocol
// PodRouteProto, exported block routes ExportProto. Scan rebuilds the view of
// what is plumbed from one link dump and one route dump.
//
// # Concurrency
//
// A Dataplane is safe for concurrent use; it holds no lock of its own
// across a kernel call. Attachment operations take node-side netlink
// sockets of their own from a pool, so they only meet at the kernel's own
// RTNL lock. A Teardown's veth delete finishes in the background: the
// Teardown returns once the kernel has unregistered the pair, without
// waiting for it to be freed (unlisted_linux.go).
package dataplane

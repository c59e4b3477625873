package egress

// # What each side makes
//
// In a client pod (ApplyClient): FoU receive ports (UDP Port: IPIP for
// IPv4, IPv6-in-IPv6 for IPv6); per gateway and family a tunnel
// "egr4-"/"egr6-" + 8 hex digits of a hash of "<namespace>/<name>",
// remote the Service's ClusterIP, local the pod's address; per family with
// a tunnel, the flow-based "egr4-flow"/"egr6-flow" for what comes from a
// router pod's own address (see Session persistence); the
// seed's policy rules (PrioLinkLocal .. PrioWide), and at PrioInCluster
// "to <ServiceIP>/32 (/128) lookup main" per tunnel, so that the tunnel's
// own FoU packets stay on main when the Service range is not one of the
// private ones the seed keeps there (a default route through the tunnel
// in table 118 would otherwise catch them, and the kernel drops the
// loop), and the same for each of ClientConfig.InCluster (the cluster's
// pod pools, which must not go through a gateway even when they are not
// private); routes in TableNarrow and TableWide. In a router pod (Router): the FoU ports, one tunnel
// per client address ("egc4-" + the IPv4 address's 8 hex digits; "egc6-"
// + 8 hex digits of a hash of the IPv6 address, the next candidate hash
// when another peer or a foreign device holds that name; the tunnel's
// remote address is the record of which peer a name belongs to), its /32
// (/128) route in RouterTable with the rule "iif <OutInterface> lookup
// RouterTable" at RouterRulePrio, and the nftables table NFTable (a
// forward chain that drops what comes out of a tunnel with an inner
// source other than that tunnel's client, or to a destination outside
// SyncDestinations', and counts the rest; a postrouting masquerade).
// When a peer goes, so do its conntrack entries. Every device
// carries the alias "skein-egress:..." that marks it as this package's;
// nothing without it is touched, except a crashed run's half-made tunnel
// (the alias is set by a second request): NewRouter removes an untagged
// ipip/ip6tnl device with a peer's name, and ApplyClient replaces an
// untagged device of the kind and name of a tunnel it is to make.
//
// # Session persistence
//
// kube-proxy picks a router per conntrack entry of the outer UDP flow,
// and that entry, not the inner connection, decides where traffic goes:
//
//   - Fixed source port (the default, as the seed): every packet of a
//     pod goes out as podIP:Port -> ClusterIP:Port, one conntrack entry,
//     so all of the pod's egress flows use one router for as long as that
//     entry lives. UDP entries expire after nf_conntrack_udp_timeout_stream
//     (120 s by default) without packets, and each packet refreshes
//     them, so a pod that keeps talking stays on its router
//     indefinitely; the Service's ClientIP affinity (10800 s by default)
//     pins it further. The reply path needs this: the router answers
//     from routerIP:Port, which the node's conntrack turns back into the
//     ClusterIP the pod's tunnel expects. Once that entry has expired
//     (a connection quiet for longer than the timeout) and the router
//     speaks first, its packets reach the pod from routerIP: the
//     flow-based device takes them, so the connection survives.
//   - Source port per flow (SourcePortAuto): each inner flow hashes to
//     its own outer source port and gets its own conntrack entry, so
//     flows spread over the routers (unless ClientIP affinity, which
//     pins by pod address anyway). Replies come from the router's own
//     address and land on the flow-based device.
//
// When a router goes away its endpoint leaves the Service and kube-proxy
// flushes the UDP conntrack entries that point to it: the pod's next
// packet picks another router. Connections that were NAT'd by the old
// router cannot survive (their NAT state lived there); new ones work at
// once (the guest tests check this).

// Package router is the control side of an Egress router pod
// (skein-egress): it follows one Egress and the pods that use it through
// the API server, and keeps the router's data plane (internal/egress's
// Router, behind the Dataplane interface) holding exactly one tunnel per
// address of those pods. It also serves the router's metrics and probes.
//
// Who is a client is decided by ClientAddrs alone (pure, table-tested):
// a pod annotated egress.skein.dev/<egress namespace> with a comma
// separated list naming the Egress, not on the host's network, not
// finished, with addresses in status.podIPs. The peer set is kept per pod
// from informer events, so a change costs the changed pod, not a list of
// the cluster; changes are coalesced before the data plane hears of them.
// The pod informers cover only the namespaces the Egress serves (one per
// namespace, or one over all for "*"), which is all the router's account
// may read; the Egress itself is read by name. The data plane is given
// the Egress's destinations too: the router forwards only to them.
package router

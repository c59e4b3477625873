// Package docker is skein's Docker front door: a libnetwork remote
// NetworkDriver and IpamDriver served over HTTP on a UNIX socket
// (/run/docker/plugins/skein.sock), so that
//
//	docker network create -d skein --ipam-driver skein [--subnet …] NAME
//
// gives Docker containers addresses from skein pools and routed veths like
// CNI pods get, on the same pools.
//
// It owns three kinds of state, all in skeind's store so that a restarted
// skeind answers Docker at once (Docker never activates a plugin twice):
//
//   - IPAM pools (meta "docker-ipam-pool"): one per address family of a
//     network, from RequestPool to ReleasePool;
//   - networks (meta "docker-network"): the skein pool a network uses and
//     whether it was created for it ("docker-<short ID>");
//   - attachments with Owner "docker": an IPAM lease per address Docker
//     holds (RequestAddress to ReleaseAddress; they are what keeps the
//     address from being handed out again, across restarts too), and an
//     endpoint per container interface (CreateEndpoint to DeleteEndpoint),
//     which claims its host veth so that reconcile keeps it.
//
// Docker's model splits an attachment in two: the IPAM driver owns the
// address, the network driver the link. So endpoints route addresses they
// do not own, and a lease outlives its endpoint until Docker releases it.
//
// The dataplane is CNI's routed veth (see internal/dataplane) with one
// difference: Docker moves the container end itself, from the namespace
// dockerd runs in (the node's), so both ends are created there
// (Dataplane.SetupPair) and Join names the peer. Join returns the node's
// link-local gateway with a connected route to it, so Docker adds no
// docker_gwbridge; see join for the IPv6 half-routes.
package docker

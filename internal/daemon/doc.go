// Package daemon is skeind: it wires the store, IPAM and dataplane
// together, rebuilds its view on start (reconcile), and serves the front
// doors — the CNI and Admin gRPC services on a UNIX socket, health and
// metrics on loopback.
package daemon

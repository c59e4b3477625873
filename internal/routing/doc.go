// Package routing makes pods on different nodes reach each other. skeind
// runs it in one of three modes (skeind --routing):
//
//   - export: the node's own blocks go to the export table for a routing
//     daemon (BIRD) to announce; nothing else is installed (internal/dataplane
//     does the export; this package only removes what the other modes left).
//   - direct: for every block of another node, a route via that node's
//     address, for nodes on one L2 segment (coil-router, Calico's direct mode).
//   - vxlan: one VXLAN device per node, a static FDB and neighbour entry per
//     remote node and block, and a route per remote block through the device,
//     for nodes anywhere on IP.
//
// It is declarative: the caller hands Sync the wanted set (every remote
// block with its node's addresses, from the API); Sync compares it with what
// the kernel holds under its tags (its table and route protocol, its
// device), adds and replaces before it deletes, never touches what it did
// not make, and reports per block what it applied. A restart rebuilds the
// same state from the API and the kernel. Between full syncs (at start and
// every 30 s) the Loop hands the kernel side only what a change touched
// (Kernel.Update: the routes and entries of those blocks, written against
// the record of the last Sync instead of dumps of the kernel).
//
// The kernel side is internal/routing/kernel (Linux only): what it owns
// in the kernel and how it programs it are said there. This package holds
// the watcher of the API (Watcher, Snapshot), the Loop between it and a
// Syncer, and the types both sides share (Remote, Status, Mode).
package routing

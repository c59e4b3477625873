// Package controller holds skein-controller's reconcilers, one small
// level-triggered reconciler per concern: each re-reads its object, treats
// NotFound as done, never changes what it read from the cache in place
// without writing it back, and writes status last.
//
// The controller is not in the path of an address: nodes claim their
// AddressBlocks themselves (skeind creates "<pool>-<index>" with its own
// nodeName; the API server's name uniqueness is the lock) and free them
// themselves. What is left to a cluster-wide controller:
//
//   - AddressPoolReconciler keeps a pool's status (blocks claimed and
//     total, Ready, Exhausted), written at most once per StatusInterval
//     however many blocks come and go, and holds a deleted pool with its
//     finalizer until its last block is gone (at once, not debounced).
//   - NodeGCReconciler takes back what nodes gone for good leave: their
//     blocks (deleted, finalizer removed) and liveness Lease, but only
//     once the Node is deleted and the node's Lease has not been renewed
//     for a grace period, so a running node never loses a block it hands
//     addresses out of. It also deletes BlockRequests of the retired grant
//     protocol. It runs on the events of Nodes, blocks and requests, and
//     in a periodic sweep.
//
// Egress gateways have a package of their own (internal/egresscontroller);
// what the reconcilers share (work queue, error counts, conflict requeue)
// is internal/ctrlutil. The AddressPool validating webhook
// (internal/webhook) serves on every replica.
//
// Setup registers every reconciler of skein-controller (these and the
// Egress one) with a manager, where they run only on the leader; their
// metrics (skein_*) join controller-runtime's registry. Block arithmetic
// is internal/ipam's Geometry, built from an AddressPool by
// AddressPool.Geometry (api/v1alpha1), as the embedded store does.
package controller

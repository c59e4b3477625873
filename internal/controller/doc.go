// Package controller holds skein-controller's reconcilers, one small
// level-triggered reconciler per concern: each re-reads its object, treats
// NotFound as done, never changes what it read from the cache in place
// without writing it back, and writes status last.
//
//   - BlockRequestReconciler carves blocks of a pool for nodes.
//   - AddressPoolReconciler keeps a pool's status (blocks carved and total,
//     Ready, Exhausted) and holds a deleted pool until its blocks are gone.
//   - NodeGCReconciler removes the blocks and requests of deleted Nodes,
//     on the Node's deletion and in a periodic sweep.
//
// Setup registers them all with a manager; their metrics (skein_*) join
// controller-runtime's registry. Block arithmetic is internal/ipam's
// Geometry, shared with the embedded store (PoolGeometry builds one from
// an AddressPool).
package controller

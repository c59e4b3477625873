// Package controller holds skein-controller's reconcilers, one small
// level-triggered reconciler per kind of skein.dev/v1alpha1: each re-reads
// its object, treats NotFound as done, never changes what it read from the
// cache in place without writing it back, and writes status last.
//
// So far: BlockRequestReconciler, which carves blocks of a pool for nodes.
// Block arithmetic is internal/ipam's Geometry, shared with the embedded
// store (PoolGeometry builds one from an AddressPool).
package controller

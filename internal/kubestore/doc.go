// Package kubestore is skeind's store in Kubernetes mode (--store
// kubernetes): pools and blocks live in the API server, attachments stay in
// the node's embedded store.
//
// Pools are AddressPool objects, read through an informer; skeind never
// writes them. A node's blocks are the AddressBlocks whose nodeName is the
// node. The node claims a block itself (ClaimBlock): one create of the
// AddressBlock "<pool>-<index>", which the API server refuses when the
// name exists — create-if-absent is the lock, and no controller is in the
// path. It frees a block by deleting it with a UID precondition and
// removing its finalizer (ReleaseBlock). The Store implements
// ipam.ClusterStore: it proves ownership from what it created and what its
// cache sees (Owns) and tells the Manager when a pool or one of its
// node's blocks changes (Watch).
//
// While it runs, the Store renews the node's liveness Lease
// (skeinv1.NodeLeaseName) so that skein-controller never takes the blocks
// of a live node, even one whose Node object was deleted.
//
// Everything a pod ADD or DEL reads comes from the informer caches and the
// local store, so while the node's blocks have room an ADD or DEL makes no
// API request at all; the skein_api_requests_total counter shows it.
package kubestore

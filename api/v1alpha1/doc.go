// Package v1alpha1 is skein's Kubernetes API, group skein.dev: the
// cluster-scoped kinds that make the API server skein's store in Kubernetes
// mode, and the namespaced Egress.
//
//   - AddressPool: subnets carved into blocks of 2^blockSizeBits addresses
//     (the same geometry as the embedded store, internal/ipam).
//   - AddressBlock: one block of a pool, owned by one node (nodeName),
//     named "<pool>-<index>" so the API server's name uniqueness forbids two
//     blocks with one index: a node claims a block by creating it.
//   - BlockRequest: retired (the controller no longer answers it); kept in
//     the scheme so that a cluster moving over can list and delete old ones.
//   - Egress: a NAT gateway of router pods that chosen pods reach through
//     Foo-over-UDP tunnels, run by skein-controller as a Deployment and a
//     Service.
//
// The package depends on apimachinery only (no controller-runtime, no
// client-go), so anything may import it. zz_generated.deepcopy.go and the
// CRDs in deploy/kubernetes/crd come from controller-gen: run
// `make generate` after editing the types.
//
// +kubebuilder:object:generate=true
// +groupName=skein.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is skein.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "skein.dev", Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers the kinds of this package in a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&AddressPool{}, &AddressPoolList{},
		&AddressBlock{}, &AddressBlockList{},
		&BlockRequest{}, &BlockRequestList{},
		&Egress{}, &EgressList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Labels, annotations and finalizers skein puts on objects.
const (
	// LabelPool on an AddressBlock names its AddressPool.
	LabelPool = "skein.dev/pool"
	// LabelNode on an AddressBlock names the node that owns it.
	LabelNode = "skein.dev/node"
	// LabelRequest on an AddressBlock is the UID of the BlockRequest it
	// was carved for, so a controller that retries finds it.
	LabelRequest = "skein.dev/request"
	// AnnotationPool on a namespace names the pool its pods take addresses
	// from (DefaultPool without it). Namespaces are admin objects, so pod
	// owners cannot choose a pool.
	AnnotationPool = "skein.dev/pool"
	// AnnotationNodeAddress on a Node gives the node's underlay addresses
	// for routing between nodes (skeind --routing direct or vxlan): comma
	// separated, at most one per family. Without it peers use the Node's
	// InternalIPs. skeind --node-address writes it on its own Node.
	AnnotationNodeAddress = "skein.dev/node-address"
	// DefaultPool is the pool of a namespace without AnnotationPool.
	DefaultPool = "default"
	// FinalizerBlock on an AddressBlock keeps it until its node has let
	// go of it; FinalizerPool on an AddressPool keeps the pool while any
	// of its blocks exists.
	FinalizerBlock = "skein.dev/block"
	FinalizerPool  = "skein.dev/pool"
	// NodeLeasePrefix names a node's liveness Lease (coordination.k8s.io)
	// in skein's namespace: skeind renews NodeLeaseName(node) while it
	// runs, and the controller takes a deleted Node's blocks back only
	// once that Lease has expired.
	NodeLeasePrefix = "skein-node-"
)

// DefaultMaxBlocksPerNode is AddressPoolSpec.MaxBlocksPerNode when unset.
const DefaultMaxBlocksPerNode = 16

// MaxBlocks is the pool's MaxBlocksPerNode, or its default.
func (s AddressPoolSpec) MaxBlocks() int {
	if s.MaxBlocksPerNode <= 0 {
		return DefaultMaxBlocksPerNode
	}
	return int(s.MaxBlocksPerNode)
}

// NodeLeaseName is the name of node's liveness Lease.
func NodeLeaseName(node string) string { return NodeLeasePrefix + node }

package routing

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

// NodeEvents records Warning events on Node objects, as component skeind
// from this node. Events of Nodes (cluster-scoped) land in the default
// namespace; the client aggregates repeats.
type NodeEvents struct {
	b   record.EventBroadcaster
	rec record.EventRecorder
}

var _ Eventer = (*NodeEvents)(nil)

// NewNodeEvents starts a recorder; Close stops it.
func NewNodeEvents(cfg *rest.Config, node string) (*NodeEvents, error) {
	cs, err := typedcorev1.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes events client: %w", err)
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.Events("")})
	return &NodeEvents{b: b, rec: b.NewRecorder(scheme, corev1.EventSource{Component: "skeind", Host: node})}, nil
}

// NodeWarning records a Warning event on node.
func (e *NodeEvents) NodeWarning(node NodeInfo, reason, message string) {
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
	e.rec.Event(ref, corev1.EventTypeWarning, reason, message)
}

// Warning records a Warning event on obj, a kind of the routing scheme
// (a Pod of this node: skeind's egress client reports there).
func (e *NodeEvents) Warning(obj runtime.Object, reason, message string) {
	e.rec.Event(obj, corev1.EventTypeWarning, reason, message)
}

// Close stops sending events (those queued may be dropped).
func (e *NodeEvents) Close() { e.b.Shutdown() }

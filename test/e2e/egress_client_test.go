package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kubenode"
)

// TestKubeEgressAddFails: the real skeind binary, with its real egress
// data plane, cannot give a pod its tunnel on this host (its kernel has no
// fou, ipip or ip6tnl; the data plane itself is tested in a qemu guest):
// the ADD of a pod naming an Egress fails with an error naming the pod,
// and leaves nothing: the node's links, routes and rules, the pod
// namespace, the attachments and the addresses are as before. A pod
// naming no Egress on the same node attaches as ever.
func TestKubeEgressAddFails(t *testing.T) {
	topo := harness.NewTopology(t, harness.TopologyOptions{Nodes: 1})
	cl := kubenode.StartCluster(t, kubenode.ClusterOptions{Topology: topo})
	n := cl.Nodes[0]
	ctx := context.Background()
	eg := &skeinv1.Egress{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nat"},
		Spec: skeinv1.EgressSpec{Destinations: []string{"0.0.0.0/0"}}}
	if err := cl.Client.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Service default/nat with a ClusterIP", func() string {
		svc := &corev1.Service{}
		if err := cl.Client.Get(ctx, client.ObjectKeyFromObject(eg), svc); err != nil {
			return err.Error()
		}
		if svc.Spec.ClusterIP == "" {
			return "no ClusterIP"
		}
		return ""
	})
	for _, name := range []string{"plain", "client"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
		if name == "client" {
			p.Annotations = map[string]string{skeinv1.AnnotationEgressPrefix + "default": "nat"}
		}
		if err := cl.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// The ADD of the annotated pod makes (and undoes) its block's first
	// claim otherwise: warm the node up with the plain pod first.
	if _, err := n.AddPod(t, "default", "plain"); err != nil {
		t.Fatalf("ADD of a pod naming no Egress: %v", err)
	}
	before := n.D.NodeState(t)
	atts := len(n.D.Attachments(t))
	_, err := n.AddPod(t, "default", "client")
	if err == nil || !strings.Contains(err.Error(), "egress of pod default/client") {
		t.Fatalf("ADD of a pod naming Egress default/nat on a kernel without fou: %v; want an error about the pod's egress", err)
	}
	t.Logf("ADD failed as it should: %v", err)
	harness.AssertSame(t, before, n.D.NodeState(t))
	if v := n.Sample(t, `skein_egress_apply_seconds_count{result="error"}`); v != "1" {
		t.Errorf("skein_egress_apply_seconds_count{result=\"error\"} = %q, want 1", v)
	}
	if got := len(n.D.Attachments(t)); got != atts {
		t.Errorf("attachments: %d before the failed ADD, %d after", atts, got)
	}
}

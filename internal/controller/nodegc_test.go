package controller

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/utils/ptr"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// TestNodeGCSweep: the periodic sweep, run once without a manager, finds
// the blocks and requests of nodes that do not exist and keeps those of
// nodes that do.
func TestNodeGCSweep(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := newPool("sweep", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.106.0.0/24")})
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	newNode(t, c, "alive")
	carver := &BlockRequestReconciler{Client: c}
	for i, node := range []string{"alive", "gone", "alive", "gone"} {
		request(c, t, node, "sweep")
		blk, err := carver.newBlock(p, mustGeometry(t, p), uint32(i),
			&skeinv1.BlockRequest{Spec: skeinv1.BlockRequestSpec{NodeName: node, PoolName: "sweep"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, blk); err != nil {
			t.Fatal(err)
		}
	}
	gc := &NodeGCReconciler{Client: c}
	if err := gc.Sweep(ctx); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if b, r := objectsOf(t, c, "gone"); len(b)+len(r) > 0 {
		t.Errorf("after a sweep, the missing node still has blocks %v and requests %v", b, r)
	}
	if b, r := objectsOf(t, c, "alive"); len(b) != 2 || len(r) != 2 {
		t.Errorf("the existing node has blocks %v and requests %v, want 2 of each", b, r)
	}
	// Sweeping again finds nothing more to do.
	if err := gc.Sweep(ctx); err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if b, _ := objectsOf(t, c, "alive"); fmt.Sprint(b) != "[sweep-0 sweep-2]" {
		t.Errorf("the existing node's blocks after two sweeps: %v", b)
	}
}

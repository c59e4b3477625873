package controller

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// lease reads node's Lease from the API server; nil when there is none.
func (r *NodeGCReconciler) lease(ctx context.Context, node string) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: r.leaseNamespace(), Name: skeinv1.NodeLeaseName(node)}
	err := r.reader().Get(ctx, key, l)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get Lease %s of node %s: %w", key, node, err)
	}
	return l, nil
}

// aliveUntil is when a node whose Node is gone counts as gone too: Grace
// past the end of its Lease, and past its newest block's creation (a
// node claims blocks only while it runs; without a Lease, that is all
// there is to go by).
func (r *NodeGCReconciler) aliveUntil(lease *coordinationv1.Lease, blocks []skeinv1.AddressBlock) (time.Time, string) {
	var last time.Time
	why := "no Lease"
	if lease != nil {
		last = leaseEnd(lease)
		why = "Lease ends " + last.UTC().Format(time.RFC3339)
	}
	for i := range blocks {
		if c := blocks[i].CreationTimestamp.Time; c.After(last) {
			last = c
			why = "block " + blocks[i].Name + " made " + c.UTC().Format(time.RFC3339)
		}
	}
	return last.Add(orDefault(r.Grace, DefaultNodeGCGrace)), why
}

// leaseEnd is when l runs out: its duration after its last renewal. The
// renewal is the later of two times: renewTime (or acquireTime), which
// the node writes by its own clock, and the last time the API server saw
// a writer change the Lease (its managedFields, the server's clock, to
// the second). A node whose clock is behind would look expired by its
// renewTime alone while it renews every ten seconds.
func leaseEnd(l *coordinationv1.Lease) time.Time {
	t := l.CreationTimestamp.Time
	switch {
	case l.Spec.RenewTime != nil:
		t = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		t = l.Spec.AcquireTime.Time
	}
	for _, mf := range l.ManagedFields {
		// Whole seconds, rounded down: one more.
		if mf.Time != nil && mf.Time.Add(time.Second).After(t) {
			t = mf.Time.Add(time.Second)
		}
	}
	if d := l.Spec.LeaseDurationSeconds; d != nil {
		t = t.Add(time.Duration(*d) * time.Second)
	}
	return t
}

package identity

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

const (
	notOwnNode = "may not change Node n2"
	onlyAddr   = "may change only the annotation skein.dev/node-address"
	notOwnHold = "may write only the Lease skein-system/skein-node-n1"
)

// patchesNode is a request merge-patching node. {phase} in patch is
// replaced by the phase: a refused change must still be a change in the
// second phase, after the first made it.
func patchesNode(node, patch string) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error {
		return mergePatch(ctx, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, strings.ReplaceAll(patch, "{phase}", f.phase))
	}
}

// addressPatch sets skein.dev/node-address as skeind --node-address does
// (a merge patch touching nothing else).
var addressPatch = fmt.Sprintf(`{"metadata":{"annotations":{%q:"192.0.2.1,{phase}"}}}`, skeinv1.AnnotationNodeAddress)

func nodeRows() []row {
	return []row{
		{name: "publish its node address", as: bound, do: patchesNode(me, addressPatch), allowed: true},
		// A patch that carries the resourceVersion (an optimistic lock),
		// and a server-side apply, whose managedFields change: what the
		// API server writes itself is not compared.
		{name: "publish its node address with a resourceVersion", as: bound, allowed: true,
			do: func(ctx context.Context, f *fixture, c client.Client) error {
				n := &corev1.Node{}
				if err := c.Get(ctx, client.ObjectKey{Name: me}, n); err != nil {
					return err
				}
				old := n.DeepCopy()
				metav1.SetMetaDataAnnotation(&n.ObjectMeta, skeinv1.AnnotationNodeAddress, "192.0.2.2,"+f.phase)
				return c.Patch(ctx, n, client.MergeFromWithOptions(old, client.MergeFromWithOptimisticLock{}))
			}},
		{name: "publish its node address by server-side apply", as: bound, allowed: true,
			do: func(ctx context.Context, f *fixture, c client.Client) error {
				apply := fmt.Sprintf(`{"apiVersion":"v1","kind":"Node","metadata":{"name":%q,"annotations":{%q:"192.0.2.3,%s"}}}`,
					me, skeinv1.AnnotationNodeAddress, f.phase)
				return c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: me}}, client.RawPatch(types.ApplyPatchType, []byte(apply)),
					client.FieldOwner("skeind-apply"), client.ForceOwnership)
			}},
		{name: "remove its node address", as: bound, allowed: true,
			setup: func(ctx context.Context, f *fixture) error {
				return mergePatch(ctx, f.admin, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: me}}, strings.ReplaceAll(addressPatch, "{phase}", f.phase))
			},
			do: patchesNode(me, fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, skeinv1.AnnotationNodeAddress))},
		{name: "publish another node's address", as: bound, do: patchesNode(other, addressPatch), want: notOwnNode},
		{name: "label another node", as: bound, want: notOwnNode,
			do: patchesNode(other, `{"metadata":{"labels":{"test.skein.dev/x":"{phase}"}}}`)},
		{name: "label its node", as: bound, want: onlyAddr,
			do: patchesNode(me, `{"metadata":{"labels":{"test.skein.dev/x":"{phase}"}}}`)},
		{name: "taint its node", as: bound, want: onlyAddr,
			do: patchesNode(me, `{"spec":{"taints":[{"key":"test.skein.dev/{phase}","effect":"NoSchedule"}]}}`)},
		{name: "cordon its node", as: bound, want: onlyAddr,
			setup: func(ctx context.Context, f *fixture) error {
				return mergePatch(ctx, f.admin, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: me}}, `{"spec":{"unschedulable":null}}`)
			},
			do: patchesNode(me, `{"spec":{"unschedulable":true}}`)},
		{name: "add a finalizer to its node", as: bound, want: onlyAddr,
			do: patchesNode(me, `{"metadata":{"finalizers":["test.skein.dev/{phase}"]}}`)},
		{name: "annotate its node otherwise", as: bound, want: onlyAddr,
			do: patchesNode(me, `{"metadata":{"annotations":{"test.skein.dev/x":"{phase}"}}}`)},
		{name: "publish its node address and annotate otherwise", as: bound, want: onlyAddr,
			do: patchesNode(me, fmt.Sprintf(`{"metadata":{"annotations":{%q:"192.0.2.4","test.skein.dev/y":"{phase}"}}}`, skeinv1.AnnotationNodeAddress))},
	}
}

func lease(name, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
}

// noLease is a setup removing Lease name; hasLease one making it.
func noLease(name string) func(ctx context.Context, f *fixture) error {
	return func(ctx context.Context, f *fixture) error {
		return client.IgnoreNotFound(f.admin.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}))
	}
}

func hasLease(name string) func(ctx context.Context, f *fixture) error {
	return func(ctx context.Context, f *fixture) error {
		err := f.admin.Create(ctx, lease(name, "someone"))
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}
}

func createsLease(name string) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error { return c.Create(ctx, lease(name, me)) }
}

// renews is what skeind does every 10 s: read, set renewTime, update.
func renews(name string) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error {
		l := &coordinationv1.Lease{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l); err != nil {
			return err
		}
		l.Spec.HolderIdentity = ptr.To(me)
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		return c.Update(ctx, l)
	}
}

func deletesLease(name string) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error {
		return c.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}})
	}
}

func leaseRows() []row {
	mine, others := skeinv1.NodeLeaseName(me), skeinv1.NodeLeaseName(other)
	return []row{
		{name: "create its lease", as: bound, setup: noLease(mine), do: createsLease(mine), allowed: true},
		{name: "renew its lease", as: bound, setup: hasLease(mine), do: renews(mine), allowed: true},
		{name: "delete its lease", as: bound, setup: hasLease(mine), do: deletesLease(mine), allowed: true},
		{name: "create another node's lease", as: bound, setup: noLease(others), do: createsLease(others), want: notOwnHold},
		{name: "renew another node's lease", as: bound, setup: hasLease(others), do: renews(others), want: notOwnHold},
		{name: "delete another node's lease", as: bound, setup: hasLease(others), do: deletesLease(others), want: notOwnHold},
		// The controller's leader election Lease, in the same namespace.
		{name: "renew the controller's lease", as: bound, setup: hasLease("skein-controller"), do: renews("skein-controller"), want: notOwnHold},
	}
}

// noNodeRows: skeind's account with credentials naming no node writes
// nothing, not even what would be node n1's.
func noNodeRows() []row {
	var rows []row
	for _, as := range []string{unbound, static} {
		rows = append(rows,
			row{name: "claim a block", as: as, do: claims(blk(0, me, me)), want: noNode},
			row{name: "free a block", as: as, setup: makes(blk(0, me, me)), do: frees(0), want: noNode},
			row{name: "adopt an old block", as: as, setup: makes(blk(0, "", me)), do: patches(0, `{"nodeName":"n1"}`), want: noNode},
			row{name: "publish a node address", as: as, do: patchesNode(me, addressPatch), want: noNode},
			row{name: "create a lease", as: as, setup: noLease(skeinv1.NodeLeaseName(me)), do: createsLease(skeinv1.NodeLeaseName(me)), want: noNode},
		)
	}
	return rows
}

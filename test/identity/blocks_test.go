package identity

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// The policy's messages the rows look for.
const (
	notOwnClaim = "may create only its own AddressBlocks"
	badName     = "the name <pool>-<index>"
	notOwner    = `is node "n2"'s: node n1 may not`
	fixedFields = "may not change a block's labels"
	nodeNameTo  = "may set nodeName only to itself"
	noNode      = "names no node (no authentication.kubernetes.io/node-name claim)"
)

// makes is a setup that creates blocks as the admin.
func makes(blocks ...func(f *fixture) *skeinv1.AddressBlock) func(ctx context.Context, f *fixture) error {
	return func(ctx context.Context, f *fixture) error {
		for _, b := range blocks {
			if err := f.admin.Create(ctx, b(f)); err != nil {
				return err
			}
		}
		return nil
	}
}

// blk is block index of the row's pool (see fixture.block).
func blk(index int64, nodeName, node string) func(f *fixture) *skeinv1.AddressBlock {
	return func(f *fixture) *skeinv1.AddressBlock { return f.block(index, nodeName, node) }
}

// claims is a request creating a block.
func claims(b func(f *fixture) *skeinv1.AddressBlock) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error { return c.Create(ctx, b(f)) }
}

// patches is a request merge-patching block index of the row's pool.
func patches(index int64, patch string) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error {
		return mergePatch(ctx, c, &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: f.name(index)}}, patch)
	}
}

// frees is what skeind does to let a block go (internal/kubestore): a
// delete with a UID precondition, then its finalizer removed with a JSON
// patch that tests the entry; then the block must be gone.
func frees(index int64) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error {
		b := &skeinv1.AddressBlock{}
		if err := c.Get(ctx, client.ObjectKey{Name: f.name(index)}, b); err != nil {
			return err
		}
		if err := c.Delete(ctx, b, client.Preconditions{UID: &b.UID}); err != nil {
			return err
		}
		if err := dropsFinalizer(index)(ctx, f, c); err != nil {
			return err
		}
		err := f.admin.Get(ctx, client.ObjectKey{Name: b.Name}, b)
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("block %s still there after it was freed: %v", b.Name, err)
		}
		return nil
	}
}

// dropsFinalizer removes skeind's finalizer from block index as
// internal/kubestore does.
func dropsFinalizer(index int64) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error {
		b := &skeinv1.AddressBlock{}
		if err := c.Get(ctx, client.ObjectKey{Name: f.name(index)}, b); err != nil {
			return err
		}
		i := slices.Index(b.Finalizers, skeinv1.FinalizerBlock)
		patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`,
			i, skeinv1.FinalizerBlock, i)
		return c.Patch(ctx, b, client.RawPatch(types.JSONPatchType, []byte(patch)))
	}
}

// deleting makes block index and deletes it as the admin: it stays,
// being deleted, until its finalizer goes.
func deleting(index int64, nodeName, node string) func(ctx context.Context, f *fixture) error {
	return func(ctx context.Context, f *fixture) error {
		b := f.block(index, nodeName, node)
		if err := f.admin.Create(ctx, b); err != nil {
			return err
		}
		return f.admin.Delete(ctx, b)
	}
}

func deletes(index int64) func(ctx context.Context, f *fixture, c client.Client) error {
	return func(ctx context.Context, f *fixture, c client.Client) error {
		return c.Delete(ctx, &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: f.name(index)}})
	}
}

func blockRows() []row {
	return []row{
		// Claims.
		{name: "claim a block for its node", as: bound, do: claims(blk(0, me, me)), allowed: true},
		{name: "claim a block for another node", as: bound, do: claims(blk(0, other, other)), want: notOwnClaim},
		{name: "claim a block labelled for another node", as: bound, do: claims(blk(0, me, other)), want: notOwnClaim},
		{name: "claim a block named for another node", as: bound, do: claims(blk(0, other, me)), want: notOwnClaim},
		{name: "claim a block without nodeName", as: bound, do: claims(blk(0, "", me)), want: notOwnClaim},
		{name: "claim a block without a pool label", as: bound, want: badName,
			do: claims(func(f *fixture) *skeinv1.AddressBlock {
				b := f.block(0, me, me)
				delete(b.Labels, skeinv1.LabelPool)
				return b
			})},
		{name: "claim a block named for another pool", as: bound, want: badName,
			do: claims(func(f *fixture) *skeinv1.AddressBlock {
				b := f.block(3, me, me)
				b.Name = "x" + b.Name // still ends in -3: the CRD lets it by
				return b
			})},

		// Freeing and changing its own blocks.
		{name: "free its block", as: bound, setup: makes(blk(0, me, me)), do: frees(0), allowed: true},
		{name: "free its block of the old protocol", as: bound, setup: makes(blk(0, "", me)), do: frees(0), allowed: true},
		{name: "remove the finalizer of its deleted block", as: bound, setup: deleting(0, me, me), do: dropsFinalizer(0), allowed: true},
		{name: "annotate its block", as: bound, setup: makes(blk(0, me, me)), allowed: true,
			do: patches(0, `{"metadata":{"annotations":{"test.skein.dev/x":"y"}}}`)},
		{name: "relabel its block for another node", as: bound, setup: makes(blk(0, me, me)), want: fixedFields,
			do: patches(0, `{"metadata":{"labels":{"skein.dev/node":"n2"}}}`)},
		{name: "remove its block's node label", as: bound, setup: makes(blk(0, me, me)), want: fixedFields,
			do: patches(0, `{"metadata":{"labels":{"skein.dev/node":null}}}`)},
		{name: "move its block to another pool", as: bound, setup: makes(blk(0, me, me)), want: fixedFields,
			do: patches(0, `{"metadata":{"labels":{"skein.dev/pool":"elsewhere"}}}`)},
		{name: "add an IPv6 slice to its block", as: bound, setup: makes(blk(0, me, me)), want: fixedFields,
			do: patches(0, `{"ipv6":"fd00::/124"}`)},

		// Adoption of blocks of the BlockRequest protocol.
		{name: "adopt its old block", as: bound, setup: makes(blk(0, "", me)), allowed: true,
			do: patches(0, `{"nodeName":"n1"}`)},
		{name: "adopt its old block for another node", as: bound, setup: makes(blk(0, "", me)), want: nodeNameTo,
			do: patches(0, `{"nodeName":"n2"}`)},
		{name: "adopt another node's old block", as: bound, setup: makes(blk(0, "", other)), want: notOwner,
			do: patches(0, `{"nodeName":"n1"}`)},

		// Another node's blocks.
		{name: "delete another node's block", as: bound, setup: makes(blk(0, other, other)), do: deletes(0), want: notOwner},
		{name: "delete another node's old block", as: bound, setup: makes(blk(0, "", other)), do: deletes(0), want: notOwner},
		{name: "remove the finalizer of another node's deleted block", as: bound, setup: deleting(0, other, other),
			do: dropsFinalizer(0), want: notOwner},
		{name: "relabel another node's block", as: bound, setup: makes(blk(0, other, other)), want: notOwner,
			do: patches(0, `{"metadata":{"labels":{"skein.dev/node":"n1"}}}`)},
		{name: "annotate another node's block", as: bound, setup: makes(blk(0, other, other)), want: notOwner,
			do: patches(0, `{"metadata":{"annotations":{"test.skein.dev/x":"y"}}}`)},
		// The CRD keeps nodeName once set, policy or not.
		{name: "take another node's block", as: bound, setup: makes(blk(0, other, other)), crd: true,
			want: "nodeName is immutable once set", do: patches(0, `{"nodeName":"n1"}`)},
	}
}

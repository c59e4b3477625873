package webhook

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// PathBlock is where the AddressBlock validator is served.
const PathBlock = "/validate-skein-dev-v1alpha1-addressblock"

// blockValidator checks a node's claim of a block (an AddressBlock
// create) against its pool: the pool exists and is not being deleted,
// the block's index is in it, its ipv4/ipv6 are that index's slices (a
// node may not claim index 3 with the addresses of index 9: routes follow
// them), and the node holds fewer than the pool's maxBlocksPerNode. Who
// may claim for which node is the admission policy's job
// (deploy/kubernetes/skeind-policy.yaml).
//
// It reads through the controller's cache: a claim costs the API server no
// extra request. The count can lag by the blocks created in the last
// moment, so a burst may pass the cap by a few; the node's own limit
// (internal/ipam) holds it for a node that is not hostile.
type blockValidator struct {
	reader client.Reader
}

var _ admission.Validator[*skeinv1.AddressBlock] = (*blockValidator)(nil)

func (v *blockValidator) ValidateCreate(ctx context.Context, b *skeinv1.AddressBlock) (admission.Warnings, error) {
	poolName := b.Labels[skeinv1.LabelPool]
	pool := &skeinv1.AddressPool{}
	if err := v.reader.Get(ctx, client.ObjectKey{Name: poolName}, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, blockInvalid(b, field.ErrorList{field.NotFound(field.NewPath("metadata", "labels", skeinv1.LabelPool), poolName)})
		}
		return nil, fmt.Errorf("read AddressPool %q: %w", poolName, err)
	}
	// The node's blocks of the pool by their labels (the admission policy
	// makes a claim's node label its nodeName): the cache copies only
	// those, not the pool's thousands.
	var list skeinv1.AddressBlockList
	if err := v.reader.List(ctx, &list, client.MatchingLabels{skeinv1.LabelPool: poolName, skeinv1.LabelNode: b.NodeName}); err != nil {
		return nil, fmt.Errorf("list the blocks of AddressPool %q: %w", poolName, err)
	}
	held := 0
	for _, o := range list.Items {
		if o.NodeName == b.NodeName && o.Name != b.Name {
			held++
		}
	}
	return nil, blockInvalid(b, ValidateBlock(b, pool, held))
}

// ValidateUpdate allows: what may change is the CRD's and the admission
// policy's to say (nodeName set once, labels kept).
func (v *blockValidator) ValidateUpdate(context.Context, *skeinv1.AddressBlock, *skeinv1.AddressBlock) (admission.Warnings, error) {
	return nil, nil
}

// ValidateDelete allows: a node gives its blocks back by deleting them.
func (v *blockValidator) ValidateDelete(context.Context, *skeinv1.AddressBlock) (admission.Warnings, error) {
	return nil, nil
}

// ValidateBlock checks a new block b of pool, whose node holds held other
// blocks of it.
func ValidateBlock(b *skeinv1.AddressBlock, pool *skeinv1.AddressPool, held int) field.ErrorList {
	var errs field.ErrorList
	if !pool.DeletionTimestamp.IsZero() {
		errs = append(errs, field.Forbidden(field.NewPath("metadata", "labels", skeinv1.LabelPool),
			fmt.Sprintf("AddressPool %s is being deleted: no block of it may be claimed", pool.Name)))
	}
	for _, ref := range b.OwnerReferences {
		if ref.Kind == "AddressPool" && ref.UID != pool.UID {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "ownerReferences"), ref.UID,
				fmt.Sprintf("the owner is another life of AddressPool %s (uid %s)", pool.Name, pool.UID)))
		}
	}
	if b.NodeName == "" {
		errs = append(errs, field.Required(field.NewPath("nodeName"), "a block names the node that owns it"))
	}
	geo, err := pool.Geometry()
	if err != nil {
		return append(errs, field.Invalid(field.NewPath("metadata", "labels", skeinv1.LabelPool), pool.Name, err.Error()))
	}
	if b.Index < 0 || b.Index >= int64(geo.Blocks()) {
		return append(errs, field.Invalid(field.NewPath("index"), b.Index, fmt.Sprintf("AddressPool %s has %d blocks", pool.Name, geo.Blocks())))
	}
	v4, v6 := geo.BlockPrefixes(uint32(b.Index))
	for _, f := range []struct {
		name string
		got  *string
		want string
	}{{"ipv4", b.IPv4, prefixString(v4.IsValid(), v4.String())}, {"ipv6", b.IPv6, prefixString(v6.IsValid(), v6.String())}} {
		got := ""
		if f.got != nil {
			got = *f.got
		}
		if got != f.want {
			errs = append(errs, field.Invalid(field.NewPath(f.name), got,
				fmt.Sprintf("block %d of AddressPool %s is %q", b.Index, pool.Name, f.want)))
		}
	}
	if (!v4.IsValid() || geo.SliceReserved(uint32(b.Index), false)) && (!v6.IsValid() || geo.SliceReserved(uint32(b.Index), true)) {
		errs = append(errs, field.Forbidden(field.NewPath("index"),
			fmt.Sprintf("AddressPool %s reserves every address of block %d: no node may claim it", pool.Name, b.Index)))
	}
	if limit := pool.Spec.MaxBlocks(); held >= limit {
		errs = append(errs, field.Forbidden(field.NewPath("nodeName"),
			fmt.Sprintf("node %s holds %d blocks of AddressPool %s, its maxBlocksPerNode", b.NodeName, held, pool.Name)))
	}
	return errs
}

func prefixString(ok bool, s string) string {
	if !ok {
		return ""
	}
	return s
}

func blockInvalid(b *skeinv1.AddressBlock, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(skeinv1.GroupVersion.WithKind("AddressBlock").GroupKind(), b.Name, errs)
}

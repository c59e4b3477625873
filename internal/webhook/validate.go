package webhook

import (
	"fmt"
	"net/netip"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
)

var (
	subnetsPath = field.NewPath("spec", "subnets")
	bitsPath    = field.NewPath("spec", "blockSizeBits")
)

// ValidateCreate checks a new pool against the others that exist. It
// returns nil or an Invalid API error listing every problem found.
func ValidateCreate(pool *skeinv1.AddressPool, others []skeinv1.AddressPool) error {
	errs := validateSpec(pool)
	errs = append(errs, validateOverlap(pool, others)...)
	return invalid(pool, errs)
}

// ValidateUpdate checks a change of old into pool against the other pools.
// Blocks already carved keep their addresses only if the pool's geometry
// keeps them: hence blockSizeBits is immutable and subnets may only be
// appended.
func ValidateUpdate(old, pool *skeinv1.AddressPool, others []skeinv1.AddressPool) error {
	var errs field.ErrorList
	if a, b := effectiveBits(old), effectiveBits(pool); a != b {
		errs = append(errs, field.Forbidden(bitsPath,
			fmt.Sprintf("blockSizeBits is immutable (was %d, now %d): blocks already carved would change size; make a new pool instead", a, b)))
	}
	errs = append(errs, validateAppendOnly(old, pool)...)
	errs = append(errs, validateSpec(pool)...)
	errs = append(errs, validateOverlap(pool, others)...)
	if len(errs) == 0 {
		errs = append(errs, validateBlocksKept(old, pool)...)
	}
	return invalid(pool, errs)
}

func invalid(pool *skeinv1.AddressPool, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(skeinv1.GroupVersion.WithKind("AddressPool").GroupKind(), pool.Name, errs)
}

func effectiveBits(p *skeinv1.AddressPool) int32 {
	if p.Spec.BlockSizeBits == 0 {
		return ipam.DefaultBlockSizeBits
	}
	return p.Spec.BlockSizeBits
}

// validateSpec checks one pool on its own: the geometry accepts it (every
// subnet holds a block, no two of its subnets overlap, dual-stack entries
// all have both families) and each dual-stack entry's subnets are the same
// size, so its IPv4 and IPv6 halves have the same number of blocks.
func validateSpec(pool *skeinv1.AddressPool) field.ErrorList {
	var errs field.ErrorList
	for i, s := range pool.Spec.Subnets {
		if s.IPv4 == nil || s.IPv6 == nil {
			continue
		}
		p4, err4 := netip.ParsePrefix(*s.IPv4)
		p6, err6 := netip.ParsePrefix(*s.IPv6)
		if err4 != nil || err6 != nil {
			continue // the geometry below names the unreadable one
		}
		h4, h6 := 32-p4.Bits(), 128-p6.Bits()
		if h4 != h6 {
			errs = append(errs, field.Invalid(subnetsPath.Index(i), fmt.Sprintf("%s + %s", p4, p6),
				fmt.Sprintf("ipv4 %s has %d host bits but ipv6 %s has %d: the two subnets of an entry must be the same size (e.g. /%d and /%d) so that they pair up block for block",
					p4, h4, p6, h6, p4.Bits(), 128-h4)))
		}
	}
	if _, err := pool.Geometry(); err != nil {
		errs = append(errs, field.Invalid(subnetsPath, summary(pool), err.Error()))
	}
	return errs
}

// validateAppendOnly refuses removing, changing or reordering entries of
// old's subnets.
func validateAppendOnly(old, pool *skeinv1.AddressPool) field.ErrorList {
	var errs field.ErrorList
	oldS, newS := old.Spec.Subnets, pool.Spec.Subnets
	for i := range oldS {
		if i >= len(newS) {
			errs = append(errs, field.Forbidden(subnetsPath.Index(i),
				fmt.Sprintf("entry %s was removed: subnets may only be appended, blocks of a removed subnet may still be in use", entryString(oldS[i]))))
			continue
		}
		if !sameEntry(oldS[i], newS[i]) {
			errs = append(errs, field.Forbidden(subnetsPath.Index(i),
				fmt.Sprintf("entry was %s and cannot become %s: subnets may only be appended, existing entries stay unchanged and in order",
					entryString(oldS[i]), entryString(newS[i]))))
		}
	}
	return errs
}

// validateBlocksKept checks, for pools that passed every other rule, that
// the blocks old had keep their index and addresses. Appending an entry
// keeps them, except where the geometry shares 32-bit block indices among
// huge IPv6 subnets: one more subnet shrinks every subnet's share. The
// first, middle and last old block are compared: a shift moves the last.
func validateBlocksKept(old, pool *skeinv1.AddressPool) field.ErrorList {
	og, err1 := old.Geometry()
	ng, err2 := pool.Geometry()
	if err1 != nil || err2 != nil {
		return nil // an old pool the geometry refuses had no blocks
	}
	n := og.Blocks()
	bad := ng.Blocks() < n
	for _, i := range []uint32{0, n / 2, n - 1} {
		if bad || n == 0 {
			break
		}
		a4, a6 := og.BlockPrefixes(i)
		b4, b6 := ng.BlockPrefixes(i)
		bad = a4 != b4 || a6 != b6
	}
	if bad {
		return field.ErrorList{field.Forbidden(subnetsPath,
			fmt.Sprintf("appending here would renumber the pool's %d existing blocks (its IPv6 subnets already use all 2^32 block indices); make a new pool instead", n))}
	}
	return nil
}

// validateOverlap refuses a pool whose subnets overlap another pool's.
// Pools being deleted count: their blocks may still be in use.
func validateOverlap(pool *skeinv1.AddressPool, others []skeinv1.AddressPool) field.ErrorList {
	mine := prefixes(pool)
	var errs field.ErrorList
	for i := range others {
		o := &others[i]
		if o.Name == pool.Name {
			continue
		}
		if a, b, ok := ipam.Overlaps(mine, prefixes(o)); ok {
			errs = append(errs, field.Invalid(subnetsPath, a.String(),
				fmt.Sprintf("%s overlaps %s of AddressPool %q: pools may not share addresses", a, b, o.Name)))
		}
	}
	return errs
}

// validateLeftBlocks refuses a pool whose subnets overlap an AddressBlock
// of another pool: a block that outlived its pool (deleted by force while
// a node still had it) still routes its addresses to that node.
func validateLeftBlocks(pool *skeinv1.AddressPool, blocks []skeinv1.AddressBlock) field.ErrorList {
	mine := prefixes(pool)
	var errs field.ErrorList
	for _, b := range blocks {
		if b.Labels[skeinv1.LabelPool] == pool.Name {
			continue
		}
		for _, s := range []*string{b.IPv4, b.IPv6} {
			if s == nil {
				continue
			}
			bp, err := netip.ParsePrefix(*s)
			if err != nil {
				continue
			}
			if a, _, ok := ipam.Overlaps(mine, []netip.Prefix{bp}); ok {
				errs = append(errs, field.Invalid(subnetsPath, a.String(),
					fmt.Sprintf("%s overlaps AddressBlock %s (%s, node %s), which outlived pool %q: delete it first",
						a, b.Name, bp, b.NodeName, b.Labels[skeinv1.LabelPool])))
			}
		}
	}
	return errs
}

// prefixes are the readable subnets of p (the schema and validateSpec
// report the rest).
func prefixes(p *skeinv1.AddressPool) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range p.Spec.Subnets {
		for _, sub := range []*string{s.IPv4, s.IPv6} {
			if sub == nil {
				continue
			}
			if pf, err := netip.ParsePrefix(*sub); err == nil {
				out = append(out, pf)
			}
		}
	}
	return out
}

func sameEntry(a, b skeinv1.SubnetSet) bool {
	return samePrefix(a.IPv4, b.IPv4) && samePrefix(a.IPv6, b.IPv6)
}

// samePrefix compares parsed prefixes, so "fd00:0::/48" equals "fd00::/48".
func samePrefix(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	pa, errA := netip.ParsePrefix(*a)
	pb, errB := netip.ParsePrefix(*b)
	if errA != nil || errB != nil {
		return *a == *b
	}
	return pa == pb
}

func entryString(s skeinv1.SubnetSet) string {
	switch {
	case s.IPv4 != nil && s.IPv6 != nil:
		return fmt.Sprintf("{ipv4: %s, ipv6: %s}", *s.IPv4, *s.IPv6)
	case s.IPv4 != nil:
		return fmt.Sprintf("{ipv4: %s}", *s.IPv4)
	case s.IPv6 != nil:
		return fmt.Sprintf("{ipv6: %s}", *s.IPv6)
	}
	return "{}"
}

func summary(p *skeinv1.AddressPool) string {
	out := ""
	for i, s := range p.Spec.Subnets {
		if i > 0 {
			out += ", "
		}
		out += entryString(s)
	}
	return out
}

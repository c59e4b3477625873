package webhook

import (
	"context"
	"fmt"
	"net/netip"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
)

// PathEgress is where the Egress validator is served.
const PathEgress = "/validate-skein-dev-v1alpha1-egress"

var destinationsPath = field.NewPath("spec", "destinations")

// ValidateEgress checks an Egress against the cluster's pools: every
// destination a CIDR without host bits, none twice (compared as parsed,
// so "2001:db8:0::/32" repeats "2001:db8::/32"), and none but a default
// route (0.0.0.0/0, ::/0) overlapping a pool's subnets unless
// spec.allowPoolOverlap says so — traffic to pods would otherwise leave
// through the NAT gateway — and no router pod template in the host's
// network namespace. It returns nil or an
// Invalid API error listing every problem.
func ValidateEgress(eg *skeinv1.Egress, pools []skeinv1.AddressPool) error {
	var errs field.ErrorList
	if len(eg.Spec.Destinations) == 0 {
		errs = append(errs, field.Required(destinationsPath, "an egress needs at least one destination CIDR"))
	}
	seen := map[netip.Prefix]int{}
	var dests []netip.Prefix
	for i, d := range eg.Spec.Destinations {
		p, err := netip.ParsePrefix(d)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(destinationsPath.Index(i), d,
				"not a CIDR: write an IPv4 or IPv6 network such as 192.0.2.0/24 or 2001:db8::/32"))
			continue
		case p != p.Masked():
			errs = append(errs, field.Invalid(destinationsPath.Index(i), d,
				fmt.Sprintf("host bits set: the network is %s", p.Masked())))
			continue
		}
		if j, ok := seen[p]; ok {
			errs = append(errs, field.Duplicate(destinationsPath.Index(i),
				fmt.Sprintf("%s (the same network as destinations[%d])", d, j)))
			continue
		}
		seen[p] = i
		dests = append(dests, p)
	}
	if t := eg.Spec.Template; t != nil && t.Spec.HostNetwork {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "template", "spec", "hostNetwork"),
			"router pods are privileged and program their own network namespace: in the host's they would rewrite the node's routing and nftables"))
	}
	if !eg.Spec.AllowPoolOverlap {
		// A default route (/0) is the exception: clients send it through
		// the tunnel only after their rules for the cluster's own networks
		// (the seed's table 118, after private ranges to main).
		var specific []netip.Prefix
		for _, p := range dests {
			if p.Bits() > 0 {
				specific = append(specific, p)
			}
		}
		for i := range pools {
			if a, b, ok := ipam.Overlaps(specific, prefixes(&pools[i])); ok {
				errs = append(errs, field.Invalid(destinationsPath, a.String(),
					fmt.Sprintf("%s overlaps %s of AddressPool %q: pod traffic there would leave through the gateway; set spec.allowPoolOverlap: true if that is meant",
						a, b, pools[i].Name)))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(skeinv1.GroupVersion.WithKind("Egress").GroupKind(), eg.Name, errs)
}

// egressValidator runs ValidateEgress with the pools the API server has
// now (not a cache, as poolValidator).
type egressValidator struct {
	reader client.Reader
}

var _ admission.Validator[*skeinv1.Egress] = (*egressValidator)(nil)

func (v *egressValidator) validate(ctx context.Context, eg *skeinv1.Egress) error {
	var pools skeinv1.AddressPoolList
	if !eg.Spec.AllowPoolOverlap {
		if err := v.reader.List(ctx, &pools); err != nil {
			return fmt.Errorf("list AddressPools to check egress destinations for overlaps: %w", err)
		}
	}
	return ValidateEgress(eg, pools.Items)
}

func (v *egressValidator) ValidateCreate(ctx context.Context, eg *skeinv1.Egress) (admission.Warnings, error) {
	return nil, v.validate(ctx, eg)
}

func (v *egressValidator) ValidateUpdate(ctx context.Context, _, eg *skeinv1.Egress) (admission.Warnings, error) {
	return nil, v.validate(ctx, eg)
}

// ValidateDelete allows every delete.
func (v *egressValidator) ValidateDelete(context.Context, *skeinv1.Egress) (admission.Warnings, error) {
	return nil, nil
}

// validatePoolEgresses refuses a pool whose subnets overlap a destination
// of an Egress that does not set allowPoolOverlap (a default route
// excepted, as in ValidateEgress): pod-to-pod traffic into the pool would
// otherwise leave through that Egress's gateway, whichever came first.
func validatePoolEgresses(pool *skeinv1.AddressPool, egs []skeinv1.Egress) field.ErrorList {
	var errs field.ErrorList
	mine := prefixes(pool)
	for i := range egs {
		eg := &egs[i]
		if eg.Spec.AllowPoolOverlap {
			continue
		}
		var specific []netip.Prefix
		for _, d := range eg.Spec.Destinations {
			if p, err := netip.ParsePrefix(d); err == nil && p.Bits() > 0 {
				specific = append(specific, p.Masked())
			}
		}
		if a, b, ok := ipam.Overlaps(mine, specific); ok {
			errs = append(errs, field.Invalid(field.NewPath("spec", "subnets"), a.String(),
				fmt.Sprintf("%s overlaps destination %s of Egress %s/%s: pod traffic into this pool would leave through that gateway; set allowPoolOverlap: true on the Egress if that is meant",
					a, b, eg.Namespace, eg.Name)))
		}
	}
	return errs
}

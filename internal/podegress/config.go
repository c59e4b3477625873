package podegress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/egress"
)

// This file is the pure part: which Egresses a pod names, and the gateway
// an Egress and its Service make.

// Wanted lists the Egresses a pod's annotations name
// (skeinv1.WantedEgresses: the one parser of the annotation, which the
// router pods use too).
func Wanted(annotations map[string]string) []types.NamespacedName {
	return skeinv1.WantedEgresses(annotations)
}

// HasEgress reports whether the annotations name any Egress.
func HasEgress(annotations map[string]string) bool {
	for k := range annotations {
		if strings.HasPrefix(k, skeinv1.AnnotationEgressPrefix) {
			return len(Wanted(annotations)) > 0
		}
	}
	return false
}

// GatewayOf is the gateway of Egress eg through its Service svc: the
// Service's ClusterIPs (one per family), the Egress's destinations, the
// FoU port and the source port choice. A Service without a ClusterIP (not
// yet allocated, or headless) is an error naming it, as is a destination
// that does not parse (the API's validation should have refused it).
func GatewayOf(eg *skeinv1.Egress, svc *corev1.Service) (egress.Gateway, error) {
	gw := egress.Gateway{
		Namespace:      eg.Namespace,
		Name:           eg.Name,
		Port:           skeinv1.EgressFoUPort,
		SourcePortAuto: eg.Spec.FoUSourcePort == skeinv1.FoUSourcePortAuto,
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var have4, have6 bool
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil { // "None" (headless) or garbage
			continue
		}
		a = a.Unmap()
		if (a.Is4() && have4) || (a.Is6() && have6) {
			continue
		}
		have4, have6 = have4 || a.Is4(), have6 || a.Is6()
		gw.ServiceIPs = append(gw.ServiceIPs, a)
	}
	if len(gw.ServiceIPs) == 0 {
		return egress.Gateway{}, fmt.Errorf("Service %s/%s of Egress %s/%s has no ClusterIP", svc.Namespace, svc.Name, eg.Namespace, eg.Name)
	}
	for _, d := range eg.Spec.Destinations {
		p, err := netip.ParsePrefix(strings.TrimSpace(d))
		if err != nil {
			return egress.Gateway{}, fmt.Errorf("Egress %s/%s: destination %q: %w", eg.Namespace, eg.Name, d, err)
		}
		gw.Destinations = append(gw.Destinations, p.Masked())
	}
	return gw, nil
}

// sameConfig reports whether two configurations are equal.
func sameConfig(a, b egress.ClientConfig) bool {
	return slices.Equal(a.InCluster, b.InCluster) && slices.EqualFunc(a.Gateways, b.Gateways, func(x, y egress.Gateway) bool {
		return x.Namespace == y.Namespace && x.Name == y.Name && x.Port == y.Port && x.SourcePortAuto == y.SourcePortAuto &&
			slices.Equal(x.ServiceIPs, y.ServiceIPs) && slices.Equal(x.Destinations, y.Destinations)
	})
}

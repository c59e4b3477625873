package podegress

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/egress"
)

func TestWanted(t *testing.T) {
	nn := func(ns, n string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: n} }
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want []types.NamespacedName
	}{
		{"none", nil, nil},
		{"other annotations", map[string]string{"skein.dev/networks": "a", "egress.skein.dev": "x"}, nil},
		{"empty value", map[string]string{"egress.skein.dev/ns1": " , ,"}, nil},
		{"empty namespace", map[string]string{"egress.skein.dev/": "a"}, nil},
		{"one", map[string]string{"egress.skein.dev/ns1": "nat"}, []types.NamespacedName{nn("ns1", "nat")}},
		{"spaces, repeats, sorted", map[string]string{"egress.skein.dev/ns2": " b ,a,, b", "egress.skein.dev/ns1": "z"},
			[]types.NamespacedName{nn("ns1", "z"), nn("ns2", "a"), nn("ns2", "b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Wanted(tc.ann)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Wanted(%v) = %v, want %v", tc.ann, got, tc.want)
			}
			if HasEgress(tc.ann) != (len(tc.want) > 0) {
				t.Errorf("HasEgress(%v) = %v", tc.ann, HasEgress(tc.ann))
			}
		})
	}
}

func TestGatewayOf(t *testing.T) {
	eg := func(sport string, dsts ...string) *skeinv1.Egress {
		return &skeinv1.Egress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nat"},
			Spec: skeinv1.EgressSpec{Destinations: dsts, FoUSourcePort: sport}}
	}
	svc := func(ips ...string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nat"}, Spec: corev1.ServiceSpec{ClusterIPs: ips}}
	}
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name    string
		eg      *skeinv1.Egress
		svc     *corev1.Service
		want    egress.Gateway
		wantErr string
	}{
		{"dual stack, fixed", eg("Fixed", "0.0.0.0/0", "2001:db8::/32"), svc("10.96.0.10", "fd00:96::10"),
			egress.Gateway{Namespace: "ns", Name: "nat", Port: 5555, ServiceIPs: []netip.Addr{a("10.96.0.10"), a("fd00:96::10")},
				Destinations: []netip.Prefix{p("0.0.0.0/0"), p("2001:db8::/32")}}, ""},
		{"auto, default port", eg("Auto", "192.0.2.0/24"), svc("10.96.0.10"),
			egress.Gateway{Namespace: "ns", Name: "nat", Port: 5555, SourcePortAuto: true, ServiceIPs: []netip.Addr{a("10.96.0.10")},
				Destinations: []netip.Prefix{p("192.0.2.0/24")}}, ""},
		{"legacy clusterIP field", eg("", "192.0.2.0/24"), &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.11"}},
			egress.Gateway{Namespace: "ns", Name: "nat", Port: 5555, ServiceIPs: []netip.Addr{a("10.96.0.11")},
				Destinations: []netip.Prefix{p("192.0.2.0/24")}}, ""},
		{"headless", eg("", "192.0.2.0/24"), svc("None"), egress.Gateway{}, "has no ClusterIP"},
		{"not allocated", eg("", "192.0.2.0/24"), svc(), egress.Gateway{}, "has no ClusterIP"},
		{"bad destination", eg("", "192.0.2.0/33"), svc("10.96.0.10"), egress.Gateway{}, `destination "192.0.2.0/33"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := GatewayOf(tc.eg, tc.svc)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("GatewayOf = %+v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("GatewayOf = %+v, %v; want %+v", got, err, tc.want)
			}
			if !sameConfig(egress.ClientConfig{Gateways: []egress.Gateway{got}}, egress.ClientConfig{Gateways: []egress.Gateway{tc.want}}) {
				t.Error("sameConfig says equal gateways differ")
			}
		})
	}
}

package webhook

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

func egress(name string, dests ...string) *skeinv1.Egress {
	return &skeinv1.Egress{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"},
		Spec:       skeinv1.EgressSpec{Destinations: dests},
	}
}

func TestValidateEgress(t *testing.T) {
	pools := []skeinv1.AddressPool{*pool("default", 5, dual("10.64.0.0/16", "fd00:64::/112"))}
	allowed := egress("x", "10.0.0.0/8")
	allowed.Spec.AllowPoolOverlap = true
	hostNet := egress("h", "0.0.0.0/0")
	hostNet.Spec.Template = &skeinv1.EgressPodTemplate{}
	hostNet.Spec.Template.Spec.HostNetwork = true
	for _, tc := range []struct {
		name string
		eg   *skeinv1.Egress
		want string // "" means valid
	}{
		{"internet", egress("a", "0.0.0.0/0", "::/0"), ""},
		{"half the internet covers a pool", egress("a", "0.0.0.0/1", "128.0.0.0/1"), `0.0.0.0/1 overlaps 10.64.0.0/16`},
		{"nested destinations", egress("a", "192.0.2.0/24", "192.0.2.128/25"), ""},
		{"pool overlap allowed", allowed, ""},
		{"none", egress("a"), "at least one destination"},
		{"address without length", egress("a", "192.0.2.1"), "not a CIDR"},
		{"name", egress("a", "example.com/24"), "not a CIDR"},
		{"host bits", egress("a", "192.0.2.1/24"), "host bits set: the network is 192.0.2.0/24"},
		{"host bits v6", egress("a", "2001:db8::1/32"), "the network is 2001:db8::/32"},
		{"duplicate", egress("a", "192.0.2.0/24", "192.0.2.0/24"), "the same network as destinations[0]"},
		{"duplicate spelled differently", egress("a", "2001:db8::/32", "2001:db8:0::/32"), "spec.destinations[1]: Duplicate value"},
		{"covers a pool", egress("a", "10.0.0.0/8"), `10.0.0.0/8 overlaps 10.64.0.0/16 of AddressPool "default"`},
		{"inside a v6 pool", egress("a", "fd00:64::/120"), "allowPoolOverlap"},
		{"router pods on the host network", hostNet, "spec.template.spec.hostNetwork: Forbidden"},
	} {
		err := ValidateEgress(tc.eg, pools)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want Invalid mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestEgressWebhookThroughAPIServer(t *testing.T) {
	port := freePort(t)
	env, c := setup(t, port)
	startWebhook(t, env, Options{Port: port})
	waitServing(t, c)
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, pool("default", 5, dual("10.64.0.0/16", "fd00:64::/112"))); err != nil {
		t.Fatal(err)
	}
	const denied = `admission webhook "egresses.skein.dev" denied the request`
	refused(t, "egress over a pool", c.Create(ctx, egress("wide", "10.0.0.0/8")), denied)
	refused(t, "egress over a pool", c.Create(ctx, egress("wide", "10.0.0.0/8")), `overlaps 10.64.0.0/16 of AddressPool "default"`)
	// The schema compares strings; the webhook compares networks.
	refused(t, "duplicate spelled differently", c.Create(ctx, egress("dup", "2001:db8::/32", "2001:db8:0::/32")), "Duplicate value")
	// The schema refuses malformed destinations before the webhook.
	refused(t, "host bits", c.Create(ctx, egress("bits", "192.0.2.1/24")), "host bits")

	ok := egress("ok", "192.0.2.0/24", "2001:db8::/32")
	if err := c.Create(ctx, ok); err != nil {
		t.Fatalf("valid egress refused: %v", err)
	}
	// Updates are checked too, and a refused one changes nothing.
	ok.Spec.Destinations = append(ok.Spec.Destinations, "fd00::/8")
	refused(t, "update over a pool", c.Update(ctx, ok), `of AddressPool "default"`)
	got := &skeinv1.Egress{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ok), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Destinations) != 2 {
		t.Errorf("destinations after a refused update: %v", got.Spec.Destinations)
	}
	wide := egress("wide", "10.0.0.0/8")
	wide.Spec.AllowPoolOverlap = true
	if err := c.Create(ctx, wide); err != nil {
		t.Errorf("egress with allowPoolOverlap refused: %v", err)
	}

	// The reverse: a pool made after an Egress, inside its destinations,
	// is refused (pod traffic into it would leave through the gateway);
	// the Egress that allows overlaps (wide, 10.0.0.0/8) does not count.
	const poolDenied = `admission webhook "addresspools.skein.dev" denied the request`
	refused(t, "pool inside an egress's destinations", c.Create(ctx, pool("late", 5, skeinv1.SubnetSet{IPv4: ptr.To("192.0.2.64/26")})), poolDenied)
	refused(t, "pool inside an egress's destinations", c.Create(ctx, pool("late", 5, skeinv1.SubnetSet{IPv6: ptr.To("2001:db8:1::/112")})), `overlaps destination 2001:db8::/32 of Egress apps/ok`)
	if err := c.Create(ctx, pool("beside", 5, skeinv1.SubnetSet{IPv4: ptr.To("10.70.0.0/24")})); err != nil {
		t.Errorf("a pool overlapping only an Egress with allowPoolOverlap was refused: %v", err)
	}
	// A pool grown into an Egress's destinations, too.
	beside := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "beside"}, beside); err != nil {
		t.Fatal(err)
	}
	v4 := "192.0.2.0/27"
	beside.Spec.Subnets = append(beside.Spec.Subnets, skeinv1.SubnetSet{IPv4: &v4})
	refused(t, "pool grown into an egress's destinations", c.Update(ctx, beside), "of Egress apps/ok")
}

package webhook

import (
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

func pool(name string, bits int32, subnets ...skeinv1.SubnetSet) *skeinv1.AddressPool {
	return &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       skeinv1.AddressPoolSpec{Subnets: subnets, BlockSizeBits: bits},
	}
}

func v4(s string) skeinv1.SubnetSet      { return skeinv1.SubnetSet{IPv4: ptr.To(s)} }
func v6(s string) skeinv1.SubnetSet      { return skeinv1.SubnetSet{IPv6: ptr.To(s)} }
func dual(a, b string) skeinv1.SubnetSet { return skeinv1.SubnetSet{IPv4: ptr.To(a), IPv6: ptr.To(b)} }

// check asserts err is nil when want is "", else an Invalid error whose
// message holds want.
func check(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("accepted, want an error with %q", want)
	}
	if !apierrors.IsInvalid(err) {
		t.Errorf("error is not Invalid: %v", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

func TestValidateCreate(t *testing.T) {
	others := []skeinv1.AddressPool{
		*pool("default", 5, dual("10.64.0.0/16", "fd00:64::/112")),
		*pool("v6only", 5, v6("fd00:99::/64")),
	}
	for _, tc := range []struct {
		name string
		pool *skeinv1.AddressPool
		want string
	}{
		{"v4", pool("a", 5, v4("10.65.0.0/16")), ""},
		{"dual same size", pool("a", 5, dual("10.65.0.0/24", "fd00:65::/120")), ""},
		{"default bits", pool("a", 0, v4("10.65.0.0/27")), ""},
		{"two entries", pool("a", 4, dual("10.65.0.0/24", "fd00:65::/120"), dual("10.66.0.0/28", "fd00:66::/124")), ""},
		{"same name is itself", pool("default", 5, dual("10.64.0.0/16", "fd00:64::/112")), ""},
		{"overlap other v4", pool("a", 5, v4("10.64.8.0/24")), `10.64.8.0/24 overlaps 10.64.0.0/16 of AddressPool "default"`},
		{"overlap other v6", pool("a", 5, v6("fd00:99::/80")), `of AddressPool "v6only"`},
		{"contains other", pool("a", 5, v4("10.0.0.0/8")), `10.0.0.0/8 overlaps 10.64.0.0/16`},
		{"overlap itself", pool("a", 5, v4("10.65.0.0/16"), v4("10.65.1.0/24")), "overlap"},
		{"smaller than a block", pool("a", 5, v4("10.65.0.0/28")), "smaller than one block"},
		{"v6 smaller than a block", pool("a", 8, dual("10.65.0.0/16", "fd00:65::/124")), "same size"},
		{"pair sizes differ", pool("a", 5, dual("10.65.0.0/16", "fd00:65::/64")), "ipv4 10.65.0.0/16 has 16 host bits but ipv6 fd00:65::/64 has 64"},
		{"mixed families", pool("a", 5, dual("10.65.0.0/24", "fd00:65::/120"), v4("10.66.0.0/24")), "every entry needs both"},
		{"bits out of range", pool("a", 17, v6("fd00:65::/64")), "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, ValidateCreate(tc.pool, others), tc.want)
		})
	}
}

func TestValidateUpdate(t *testing.T) {
	old := pool("p", 5, dual("10.64.0.0/24", "fd00:64::/120"))
	others := []skeinv1.AddressPool{*old, *pool("q", 5, v4("10.70.0.0/16"))}
	for _, tc := range []struct {
		name string
		pool *skeinv1.AddressPool
		want string
	}{
		{"unchanged", pool("p", 5, dual("10.64.0.0/24", "fd00:64::/120")), ""},
		{"same prefix other spelling", pool("p", 5, dual("10.64.0.0/24", "fd00:64:0::/120")), ""},
		{"append", pool("p", 5, dual("10.64.0.0/24", "fd00:64::/120"), dual("10.65.0.0/24", "fd00:65::/120")), ""},
		{"bits changed", pool("p", 6, dual("10.64.0.0/24", "fd00:64::/120")), "blockSizeBits is immutable (was 5, now 6)"},
		{"bits defaulted is the same", pool("p", 0, dual("10.64.0.0/24", "fd00:64::/120")), ""},
		{"removed", pool("p", 5), "was removed: subnets may only be appended"},
		{"changed", pool("p", 5, dual("10.64.0.0/23", "fd00:64::/119")), "cannot become {ipv4: 10.64.0.0/23, ipv6: fd00:64::/119}"},
		{"prepended", pool("p", 5, dual("10.65.0.0/24", "fd00:65::/120"), dual("10.64.0.0/24", "fd00:64::/120")), "existing entries stay unchanged and in order"},
		{"family dropped", pool("p", 5, v4("10.64.0.0/24")), "cannot become {ipv4: 10.64.0.0/24}"},
		{"append overlapping other", pool("p", 5, dual("10.64.0.0/24", "fd00:64::/120"), dual("10.70.1.0/24", "fd00:70::/120")), `of AddressPool "q"`},
		{"append unpaired", pool("p", 5, dual("10.64.0.0/24", "fd00:64::/120"), v4("10.66.0.0/24")), "every entry needs both"},
		{"append too small", pool("p", 5, dual("10.64.0.0/24", "fd00:64::/120"), dual("10.66.0.0/28", "fd00:66::/124")), "smaller than one block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, ValidateUpdate(old, tc.pool, others), tc.want)
		})
	}
}

// Huge IPv6 subnets share the 32-bit block indices: appending one more
// renumbers the blocks of the first, which must be refused.
func TestValidateUpdateRenumber(t *testing.T) {
	old := pool("big", 5, v6("fd00:1::/64"))
	grown := pool("big", 5, v6("fd00:1::/64"), v6("fd00:2::/64"))
	check(t, ValidateUpdate(old, grown, nil), "would renumber")

	small := pool("small", 5, v6("fd00:1::/112"))
	check(t, ValidateUpdate(small, pool("small", 5, v6("fd00:1::/112"), v6("fd00:2::/112")), nil), "")
}

// Every problem is listed at once.
func TestValidateUpdateListsAll(t *testing.T) {
	old := pool("p", 5, v4("10.64.0.0/24"), v4("10.65.0.0/24"))
	err := ValidateUpdate(old, pool("p", 6, v4("10.64.0.0/24")), nil)
	check(t, err, "blockSizeBits is immutable")
	check(t, err, "spec.subnets[1]")
}

// TestBlockWhollyReserved: no node may claim a block whose every address
// its pool reserves (every family's): routes follow blocks, so such a
// claim would draw the reserved range's traffic to that node. A block
// reserved in one family but not the other, or in part, may be claimed.
func TestBlockWhollyReserved(t *testing.T) {
	p := pool("p", 3, dual("10.64.0.0/28", "fd00:64::/124")) // 2 blocks of 8
	p.Spec.Reserved = []string{"10.64.0.0/29", "fd00:64::/125", "10.64.0.8", "fd00:64::9-fd00:64::f"}
	block := func(index int64) *skeinv1.AddressBlock {
		v4, v6 := fmt.Sprintf("10.64.0.%d/29", 8*index), []string{"fd00:64::/125", "fd00:64::8/125"}[index]
		return &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("p", uint32(index))},
			NodeName: "n1", Index: index, IPv4: &v4, IPv6: &v6}
	}
	if errs := ValidateBlock(block(0), p, 0); !strings.Contains(errs.ToAggregate().Error(), "reserves every address of block 0") {
		t.Errorf("block 0, reserved whole: %v", errs)
	}
	if errs := ValidateBlock(block(1), p, 0); len(errs) != 0 {
		t.Errorf("block 1, reserved in part: %v", errs)
	}
	p.Spec.Reserved = []string{"10.64.0.0/29"} // IPv4 only
	if errs := ValidateBlock(block(0), p, 0); len(errs) != 0 {
		t.Errorf("block 0, its IPv6 slice free: %v", errs)
	}
}

package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

func TestAddToScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"AddressPool", "AddressPoolList", "AddressBlock", "AddressBlockList", "BlockRequest", "BlockRequestList"} {
		if !s.Recognizes(GroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not know %s", kind)
		}
	}
}

func TestBlockName(t *testing.T) {
	for _, c := range []struct {
		pool  string
		index uint32
		want  string
	}{
		{"default", 0, "default-0"},
		{"blue", 4294967295, "blue-4294967295"},
	} {
		if got := BlockName(c.pool, c.index); got != c.want {
			t.Errorf("BlockName(%q, %d) = %q, want %q", c.pool, c.index, got, c.want)
		}
	}
}

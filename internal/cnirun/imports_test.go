package cnirun

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinariesStayThin: the CNI binaries are exec'd for every ADD and DEL,
// and each package they link adds its initialisation and page faults to
// every start (before this package, skein linked encoding/json, net and an
// HTTP/2 client's HPACK and started 0.5 ms later than a Go program linking
// os alone). They may link what bench/execfloor, skein-bench's exec floor,
// links, and this package with the few it needs.
func TestBinariesStayThin(t *testing.T) {
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	allowed := map[string]bool{
		"strconv": true, // no initialiser
		"github.com/skeinnet/skein/internal/cnirun":  true,
		"github.com/skeinnet/skein/internal/cnispec": true,
	}
	for _, dep := range deps("../../bench/execfloor") {
		allowed[dep] = true
	}
	for _, bin := range []string{"skein-cni", "skein-vm"} {
		pkg := "github.com/skeinnet/skein/cmd/" + bin
		for _, dep := range deps("../../cmd/" + bin) {
			if !allowed[dep] && dep != pkg {
				t.Errorf("cmd/%s links %s; keep it out of the CNI binaries (the work is skeind's)", bin, dep)
			}
		}
	}
}

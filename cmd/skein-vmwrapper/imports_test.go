package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps the wrapper small: it runs before every VM and only
// speaks the handover protocol.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/skeinnet/skein/") && dep != "github.com/skeinnet/skein/internal/vm/handover" && dep != "github.com/skeinnet/skein/cmd/skein-vmwrapper" {
			t.Errorf("skein-vmwrapper imports %s; it needs only internal/vm/handover", dep)
		}
		if strings.HasPrefix(dep, "google.golang.org/") || strings.HasPrefix(dep, "github.com/vishvananda/") {
			t.Errorf("skein-vmwrapper imports %s", dep)
		}
	}
}

package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps the sandbox init small: every plugin call starts it, so
// what it links decides how fast a call starts. Only the standard library
// and golang.org/x/sys belong in it.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(dep, "/")
		if !strings.Contains(first, ".") || dep == "github.com/skeinnet/skein/cmd/skein-sandbox-init" ||
			dep == "github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit" || strings.HasPrefix(dep, "golang.org/x/sys/") {
			continue
		}
		t.Errorf("cmd/skein-sandbox-init imports %s (via its dependencies); keep the init small", dep)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "net/http" || dep == "net" {
			t.Errorf("cmd/skein-sandbox-init imports %s; keep the init small", dep)
		}
	}
}

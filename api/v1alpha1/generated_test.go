package v1alpha1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// TestGenerated fails when zz_generated.deepcopy.go or a CRD in
// deploy/kubernetes/crd is not what controller-gen makes of the types
// today: it runs the Makefile's pinned controller-gen into a temporary
// directory and compares. Fix it with `make generate`.
func TestGenerated(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CONTROLLER_GEN_VERSION\s*:?=\s*(\S+)`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile sets no CONTROLLER_GEN_VERSION")
	}
	tmp := t.TempDir()
	cmd := exec.Command("go", "run", "sigs.k8s.io/controller-tools/cmd/controller-gen@"+string(m[1]),
		"object", "crd", "paths=./api/...",
		"output:crd:dir="+filepath.Join(tmp, "crd"), "output:object:dir="+filepath.Join(tmp, "object"))
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, out)
	}
	compareDirs(t, filepath.Join(tmp, "object"), ".", "zz_generated.*.go")
	compareDirs(t, filepath.Join(tmp, "crd"), filepath.Join(root, "deploy/kubernetes/crd"), "*.yaml")
}

// compareDirs fails unless the files matching glob in want and have are the
// same set with the same contents.
func compareDirs(t *testing.T, want, have, glob string) {
	t.Helper()
	w, _ := filepath.Glob(filepath.Join(want, glob))
	h, _ := filepath.Glob(filepath.Join(have, glob))
	if len(w) == 0 {
		t.Fatalf("controller-gen made no %s in %s", glob, want)
	}
	base := func(p []string) []string {
		out := make([]string, len(p))
		for i, f := range p {
			out[i] = filepath.Base(f)
		}
		return out
	}
	if !slices.Equal(base(w), base(h)) {
		t.Errorf("%s: generated files are %v, the repository has %v; run make generate", have, base(w), base(h))
		return
	}
	for i := range w {
		a, err1 := os.ReadFile(w[i])
		b, err2 := os.ReadFile(h[i])
		if err1 != nil || err2 != nil {
			t.Fatalf("read: %v %v", err1, err2)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s is stale; run make generate", h[i])
		}
	}
}

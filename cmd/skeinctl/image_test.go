package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestImagePackCNI: pack-cni writes the archive, prints its two digests
// (the archive's matches its bytes), and a failing pack or a bad command
// line leaves no file.
func TestImagePackCNI(t *testing.T) {
	if _, err := os.Stat("/usr/lib/cni/ptp"); err != nil {
		t.Skip("reference CNI plugins missing (Debian package containernetworking-plugins)")
	}
	dir := t.TempDir()
	shim := filepath.Join(dir, "skein-netplugin")
	build := exec.Command("go", "build", "-o", shim, "../skein-netplugin")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build shim: %v\n%s", err, out)
	}
	pack := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"image", "pack-cni", "--shim", shim}, args...), &stdout, &stderr, func(string) string { return "" })
		return code, stdout.String(), stderr.String()
	}

	out := filepath.Join(dir, "ptp.tar")
	code, stdout, stderr := pack("--plugin", "/usr/lib/cni/ptp", "--plugin", "/usr/lib/cni/host-local", "-o", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	m := regexp.MustCompile(`archive digest:  sha256:([0-9a-f]{64})`).FindStringSubmatch(stdout)
	if m == nil || !strings.Contains(stdout, "host-local, ptp (amd64)") || !regexp.MustCompile(`manifest digest: sha256:[0-9a-f]{64}`).MatchString(stdout) {
		t.Fatalf("output:\n%s", stdout)
	}
	sum, err := exec.Command("sha256sum", out).Output()
	if err != nil || !strings.HasPrefix(string(sum), m[1]) {
		t.Errorf("archive digest %s, sha256sum says %s (%v)", m[1], sum, err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("archive: %v %v", fi, err)
	}

	bad := filepath.Join(dir, "bad.tar")
	if code, _, stderr := pack("--plugin", filepath.Join(dir, "nope"), "-o", bad); code != 1 || !strings.Contains(stderr, "no such file") {
		t.Errorf("missing plugin: exit %d, %s", code, stderr)
	}
	if code, _, stderr := pack("-o", bad); code != 2 || !strings.Contains(stderr, "at least one --plugin") {
		t.Errorf("no plugin: exit %d, %s", code, stderr)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("left behind: %v", ents)
	}
}

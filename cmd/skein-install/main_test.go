package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstall(t *testing.T) {
	src, bin, conf := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, filepath.Join(src, "skein-cni"), "plugin zero")
	write(t, filepath.Join(src, "skein"), "plugin one")
	write(t, filepath.Join(src, "skein-vm"), "plugin two")
	confFile := filepath.Join(t.TempDir(), "10-skein.conflist")
	write(t, confFile, `{"name":"skein"}`)
	// An older plugin is replaced.
	write(t, filepath.Join(bin, "skein"), "old")

	args := []string{"--src-dir", src, "--bin-dir", bin, "--conf-dir", conf, "--conf", confFile}
	for range 2 { // twice: installing again is harmless
		var out bytes.Buffer
		if err := run(args, &out); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(out.String(), "installed "); got != 4 {
			t.Errorf("output reports %d files, want 4:\n%s", got, out.String())
		}
		// skein execs skein-cni: a runtime must never find the new skein
		// without it.
		if i, j := strings.Index(out.String(), "/skein-cni\n"), strings.Index(out.String(), "/skein\n"); i < 0 || j < i {
			t.Errorf("skein installed before skein-cni:\n%s", out.String())
		}
	}
	for path, want := range map[string]string{
		filepath.Join(bin, "skein-cni"):          "plugin zero",
		filepath.Join(bin, "skein"):              "plugin one",
		filepath.Join(bin, "skein-vm"):           "plugin two",
		filepath.Join(conf, "10-skein.conflist"): `{"name":"skein"}`,
	} {
		b, err := os.ReadFile(path)
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", path, b, err, want)
		}
	}
	for dir, mode := range map[string]os.FileMode{bin: 0o755, conf: 0o644} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			fi, _ := e.Info()
			if strings.HasPrefix(e.Name(), ".") {
				t.Errorf("temporary file %s left in %s", e.Name(), dir)
			} else if fi.Mode().Perm() != mode {
				t.Errorf("%s has mode %v, want %v", e.Name(), fi.Mode().Perm(), mode)
			}
		}
	}
}

func TestInstallBadInput(t *testing.T) {
	src, bin := t.TempDir(), t.TempDir()
	write(t, filepath.Join(src, "skein"), "x")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--src-dir", src, "--bin-dir", bin, "--plugins", "../etc/passwd"}, "invalid plugin name"},
		{[]string{"--src-dir", src, "--bin-dir", bin, "--plugins", "missing"}, "no such file"},
		{[]string{"--src-dir", src, "--bin-dir", ""}, "--bin-dir must not be empty"},
		{[]string{"--src-dir", src, "--bin-dir", bin, "--plugins", "skein", "extra"}, `unexpected argument "extra"`},
		{[]string{"--src-dir", src, "--bin-dir", bin, "--plugins", "skein", "--conf", src}, "not a regular file"},
		{[]string{"--src-dir", src, "--bin-dir", filepath.Join(bin, "nope"), "--plugins", "skein"}, "no such file"},
	} {
		err := run(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", c.args, err, c.want)
		}
	}
	// Nothing half-made: no file appeared in bin.
	if ents, _ := os.ReadDir(bin); len(ents) != 0 {
		t.Errorf("bad input left %d files in the bin dir", len(ents))
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/skeinnet/skein/test/harness"
)

// staticBinary builds a tiny static program that prints its name, the
// stand-in for skein's binaries (make build's are not needed here).
func staticBinary(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	prog := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Println(\"hello from\", os.Args[0]) }\n"
	for f, content := range map[string]string{"go.mod": "module hello\n\ngo 1.22\n", "main.go": prog} {
		if err := os.WriteFile(filepath.Join(src, f), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(t.TempDir(), "hello")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build a static test binary: %v\n%s", err, out)
	}
	return bin
}

// binDir holds a copy of bin under each of names.
func binDir(t *testing.T, bin string, names ...string) string {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, n := range names {
		// Each differs, so a swapped file shows.
		if err := os.WriteFile(filepath.Join(dir, n), append(append([]byte{}, b...), n...), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func opts(dir, out string) options {
	return options{binDir: dir, out: out, tag: "skein:dev", arch: "amd64", binaries: Binaries, mtime: time.Unix(1700000000, 0).UTC()}
}

func TestBuild(t *testing.T) {
	dir := binDir(t, staticBinary(t), Binaries...)
	out := filepath.Join(t.TempDir(), "image.tar")
	digest, err := build(opts(dir, out))
	if err != nil {
		t.Fatal(err)
	}

	// Read back as a loader would: by its tag, from the tarball.
	tag, _ := name.NewTag("skein:dev")
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("read the tarball back: %v", err)
	}
	if got, err := img.Digest(); err != nil || got != digest {
		t.Errorf("digest read back %v (%v), built %v", got, err, digest)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/skeind" {
		t.Errorf("entrypoint %q, want /usr/local/bin/skeind", cf.Config.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1 (FROM scratch)", len(layers), err)
	}

	// The files: every binary, executable, root's, byte for byte.
	files := map[string]*tar.Header{}
	contents := map[string][]byte{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = h
		contents[h.Name], _ = io.ReadAll(tr)
	}
	for _, b := range Binaries {
		h, ok := files["usr/local/bin/"+b]
		if !ok {
			t.Errorf("the image lacks /usr/local/bin/%s; it has %v", b, keys(files))
			continue
		}
		if h.Mode&0o777 != 0o755 || h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s: mode %o, owner %d:%d, time %v; want 0755, root, the given time", b, h.Mode, h.Uid, h.Gid, h.ModTime)
		}
		want, _ := os.ReadFile(filepath.Join(dir, b))
		if !bytes.Equal(contents[h.Name], want) {
			t.Errorf("%s in the image differs from %s", b, filepath.Join(dir, b))
		}
	}
	if h, ok := files["var/run"]; !ok || h.Typeflag != tar.TypeSymlink || h.Linkname != "../run" {
		t.Errorf("the image has no /var/run link to /run (a runtime's /var/run/netns path would not resolve): %v", keys(files))
	}
	if len(files) != len(Binaries)+6 { // + usr/, usr/local/, usr/local/bin/, run/, var/, var/run
		t.Errorf("the image holds %v, want the binaries, their directories and /var/run only", keys(files))
	}

	// The same binaries make the same image.
	again, err := build(opts(dir, filepath.Join(t.TempDir(), "again.tar")))
	if err != nil || again != digest {
		t.Errorf("a second build gave %v (%v), the first %v: not reproducible", again, err, digest)
	}
}

func TestBuildBadInput(t *testing.T) {
	static := staticBinary(t)
	dynamic, err := exec.LookPath("true") // Debian's coreutils link libc
	if err != nil {
		t.Skip("no true(1) to stand for a dynamic binary")
	}
	missing := binDir(t, static, "skeind")
	withDynamic := binDir(t, static, Binaries...)
	b, _ := os.ReadFile(dynamic)
	if err := os.WriteFile(filepath.Join(withDynamic, "skein"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	notELF := binDir(t, static, Binaries...)
	if err := os.WriteFile(filepath.Join(notELF, "skeinctl"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		o    func(string) options
		want string
	}{
		{"missing", func(out string) options { return opts(missing, out) }, "skein-controller: not built (run make build)"},
		{"dynamic", func(out string) options { return opts(withDynamic, out) }, "is dynamically linked"},
		{"not ELF", func(out string) options { return opts(notELF, out) }, "skeinctl: not an ELF executable"},
		{"bad tag", func(out string) options { o := opts(notELF, out); o.tag = "Skein:dev:x"; return o }, "invalid --tag"},
		{"bad name", func(out string) options { o := opts(notELF, out); o.binaries = []string{"../skeind"}; return o }, "invalid binary name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "image.tar")
			_, err := build(c.o(out))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("build = %v, want an error containing %q", err, c.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("a failed build left %d files in the output directory", len(ents))
			}
		})
	}
}

// TestPodmanLoads loads the tarball into a real podman (private storage,
// no network) and runs one of the image's binaries. Root, podman and runc.
func TestPodmanLoads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (podman with private storage)")
	}
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("no podman: make deps installs it")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("no runc: make deps installs it")
	}
	dir := binDir(t, staticBinary(t), Binaries...)
	out := filepath.Join(t.TempDir(), "image.tar")
	if _, err := build(opts(dir, out)); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	conf := filepath.Join(state, "containers.conf")
	if err := os.WriteFile(conf, []byte("[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nruntime = \"runc\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--root", filepath.Join(state, "root"), "--runroot", filepath.Join(state, "runroot"),
		"--tmpdir", filepath.Join(state, "tmp"), "--storage-driver", "vfs", "--runtime", "runc",
		"--cgroup-manager", "cgroupfs", "--events-backend", "file"}
	pod := func(args ...string) string {
		t.Helper()
		c := exec.Command(podman, append(append([]string{}, common...), args...)...)
		c.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
		b, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	t.Cleanup(func() { harness.UnmountUnder(state) })
	if got := pod("load", "-i", out); !strings.Contains(got, "skein:dev") {
		t.Errorf("podman load says %q, want it to name skein:dev", got)
	}
	got := pod("run", "--rm", "--network", "none", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--entrypoint", "/usr/local/bin/skeinctl", "localhost/skein:dev")
	if !strings.Contains(got, "hello from /usr/local/bin/skeinctl") {
		t.Errorf("the image's skeinctl printed %q", got)
	}
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestDockerfileAgrees keeps the Dockerfile, for those with an engine, and
// mkimage building the same image: the same binaries, where, and the
// same entrypoint.
func TestDockerfileAgrees(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var copied []string
	var entrypoint string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 2 && f[0] == "COPY":
			if f[len(f)-1] != Dir+"/" {
				t.Errorf("the Dockerfile copies into %s, mkimage into %s/", f[len(f)-1], Dir)
			}
			for _, src := range f[1 : len(f)-1] {
				copied = append(copied, strings.TrimPrefix(src, "bin/"))
			}
		case len(f) > 1 && f[0] == "ENTRYPOINT":
			entrypoint = strings.Join(f[1:], " ")
		}
	}
	if strings.Join(copied, ",") != strings.Join(Binaries, ",") {
		t.Errorf("the Dockerfile copies %q, mkimage %q", copied, Binaries)
	}
	if want := `["` + Dir + `/skeind"]`; entrypoint != want {
		t.Errorf("the Dockerfile's entrypoint %s, mkimage's %s", entrypoint, want)
	}
}

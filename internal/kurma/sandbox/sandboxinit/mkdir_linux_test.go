package sandboxinit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMkdirInStaysInRoot: mount points are created through an image's
// links, but always inside the image, whatever the links say.
func TestMkdirInStaysInRoot(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "var")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"var/run":  "/run",                           // absolute, dangling: created inside
		"abs":      outside,                          // absolute, naming a host directory
		"climb":    "../../../../../../.." + outside, // climbing out with ..
		"loop":     "/loop/x",                        // through itself
		"var/lib2": "../abs/lib",                     // relative, via another link
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rootFD)

	tests := []struct{ target, want, err string }{
		{target: "/var/run/netns", want: "run/netns"},
		{target: "/abs/state", want: strings.TrimPrefix(outside, "/") + "/state"},
		{target: "/climb/network", want: strings.TrimPrefix(outside, "/") + "/network"},
		{target: "/var/lib2/modules", want: strings.TrimPrefix(outside, "/") + "/lib/modules"},
		{target: "/proc", want: "proc"},
		{target: "/loop/y", err: "too many levels of symbolic links"},
	}
	for _, tt := range tests {
		fd, err := mkdirIn(rootFD, tt.target, 0)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("mkdirIn(%s) = %v, want an error containing %q", tt.target, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("mkdirIn(%s): %v", tt.target, err)
			continue
		}
		got, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		unix.Close(fd)
		if want := filepath.Join(root, tt.want); got != want {
			t.Errorf("mkdirIn(%s) opened %s, want %s", tt.target, got, want)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("the directory outside the root changed: %v", ents)
	}
}

package skeintest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/skeinnet/skein/test/tools"
)

// RequireTool returns the path of an external program the test drives, or
// skips the test if it is not installed.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("skipping: %s is not installed (make deps, i.e. scripts/install-deps.sh, installs it)", name)
	}
	return p
}

// Busybox is the static busybox (Debian's busybox-static) every test image
// and test root filesystem is made of.
const Busybox = tools.BusyboxPath

// loadBusybox is tools.LoadBusybox, skipping the test when busybox is not
// usable.
func loadBusybox(t testing.TB) *tools.Busybox {
	t.Helper()
	bb, err := tools.LoadBusybox()
	if err != nil {
		t.Skipf("skipping: %s (Debian busybox-static) is not usable: %v", Busybox, err)
	}
	return bb
}

// BusyboxTar is a root filesystem as a tar stream for `docker import` or
// `podman import` (use --change "ENV PATH=/bin", or nothing runs): busybox
// in /bin with every applet as a symlink to it, and the empty directories
// a runtime mounts over. The bytes are shared: do not modify them. It skips
// the test if busybox is not usable.
func BusyboxTar(t testing.TB) []byte {
	t.Helper()
	return loadBusybox(t).Tar
}

// BusyboxRootfs writes the same root filesystem into dir, for runtimes that
// take a directory (ctr run --rootfs).
func BusyboxRootfs(t testing.TB, dir string) {
	t.Helper()
	bb := loadBusybox(t)
	for _, d := range bb.Dirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), bb.Data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range bb.Applets {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
}

// PluginRun is how one direct execution of a CNI plugin binary ended.
type PluginRun struct {
	Stdout, Stderr []byte
	// Exit is the exit status (0: success).
	Exit int
	// SpecErr is the error the plugin printed on stdout when it exited
	// non-zero, if stdout held one with a non-zero code; nil otherwise.
	SpecErr *types.Error
}

// ExecPlugin runs a plugin binary the way a runtime does, for what libcni
// cannot send (missing variables, undecodable stdin, names libcni refuses):
// env is the whole environment (CNI_* variables; add PATH if the plugin
// needs one), stdin the network configuration. The error is for a plugin
// that could not be run at all; a plugin that fails says so in the result.
func ExecPlugin(bin string, env []string, stdin []byte) (PluginRun, error) {
	cmd := exec.Command(bin)
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := PluginRun{Stdout: out.Bytes(), Stderr: errOut.Bytes()}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return r, nil
	case !errors.As(err, &exit):
		return r, fmt.Errorf("run %s: %w", bin, err)
	}
	r.Exit = exit.ExitCode()
	var se types.Error
	if json.Unmarshal(r.Stdout, &se) == nil && se.Code != 0 {
		r.SpecErr = &se
	}
	return r, nil
}

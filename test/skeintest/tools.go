package skeintest

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
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
const Busybox = "/bin/busybox"

// busyboxDirs are the directories of a test root filesystem.
var busyboxDirs = []string{"bin", "proc", "sys", "dev", "etc", "tmp"}

var (
	bbOnce    sync.Once
	bbData    []byte
	bbApplets []string
	bbTar     []byte
	bbErr     error
)

// loadBusybox reads the binary and its applet list once per test process,
// and builds the image tar from them.
func loadBusybox(t testing.TB) {
	t.Helper()
	bbOnce.Do(func() {
		out, err := exec.Command(Busybox, "--list").Output()
		if err != nil {
			bbErr = err
			return
		}
		for _, a := range strings.Fields(string(out)) {
			// The applet named busybox would replace the binary with a
			// link to itself.
			if a != "busybox" && !strings.Contains(a, "/") {
				bbApplets = append(bbApplets, a)
			}
		}
		if bbData, bbErr = os.ReadFile(Busybox); bbErr != nil {
			return
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, d := range busyboxDirs {
			_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755})
		}
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bbData))})
		_, _ = tw.Write(bbData)
		for _, a := range bbApplets {
			_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777})
		}
		bbErr = tw.Close()
		bbTar = buf.Bytes()
	})
	if bbErr != nil {
		t.Skipf("skipping: %s (Debian busybox-static) is not usable: %v", Busybox, bbErr)
	}
}

// BusyboxTar is a root filesystem as a tar stream for `docker import` or
// `podman import` (use --change "ENV PATH=/bin", or nothing runs): busybox
// in /bin with every applet as a symlink to it, and the empty directories
// a runtime mounts over. The bytes are shared: do not modify them. It skips
// the test if busybox is not usable.
func BusyboxTar(t testing.TB) []byte {
	t.Helper()
	loadBusybox(t)
	return bbTar
}

// BusyboxRootfs writes the same root filesystem into dir, for runtimes that
// take a directory (ctr run --rootfs).
func BusyboxRootfs(t testing.TB, dir string) {
	t.Helper()
	loadBusybox(t)
	for _, d := range busyboxDirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), bbData, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range bbApplets {
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

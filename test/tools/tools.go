// Package tools holds what the tests and the demo (a program, not a test)
// both need of the real components they drive, without the testing
// package: the Docker CLI's path, the flags of a dockerd that leaves the
// host's network alone, and the busybox image every runtime gets.
package tools

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// BusyboxPath is the static busybox the images are made of (Debian's
// busybox-static).
const BusyboxPath = "/bin/busybox"

// DockerCLI is the docker client: a newer one in /usr/local/bin if there
// is one (TESTBED.md), else Debian's.
func DockerCLI() string {
	if _, err := os.Stat("/usr/local/bin/docker"); err == nil {
		return "/usr/local/bin/docker"
	}
	return "docker"
}

// DockerdArgs are the flags of a dockerd with its own roots under dir and
// its socket at sock that changes nothing of the host's network: no
// default bridge, no iptables rules, no forwarding or masquerading
// (TESTBED.md). Callers add what is theirs.
func DockerdArgs(dir, sock string) []string {
	return []string{
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"),
		"-H", "unix://" + sock,
		"--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
	}
}

// Busybox is the busybox root filesystem: the binary, its applets (one
// symlink each in /bin) and the directories a container needs.
type Busybox struct {
	Data    []byte   // /bin/busybox
	Applets []string // the applet names, "busybox" itself left out
	Dirs    []string // the directories of the root filesystem
	Tar     []byte   // all of it as a tar, for docker import and ctr
}

var (
	bbOnce sync.Once
	bb     *Busybox
	bbErr  error
)

// LoadBusybox reads BusyboxPath and its applet list once per process and
// builds the image tar.
func LoadBusybox() (*Busybox, error) {
	bbOnce.Do(func() { bb, bbErr = loadBusybox() })
	return bb, bbErr
}

func loadBusybox() (*Busybox, error) {
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", BusyboxPath, err)
	}
	b := &Busybox{Dirs: []string{"bin", "proc", "sys", "dev", "etc", "tmp"}}
	for _, a := range strings.Fields(string(out)) {
		// The applet named busybox would replace the binary with a link
		// to itself.
		if a != "busybox" && !strings.Contains(a, "/") {
			b.Applets = append(b.Applets, a)
		}
	}
	if b.Data, err = os.ReadFile(BusyboxPath); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range b.Dirs {
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755})
	}
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(b.Data))})
	_, _ = tw.Write(b.Data)
	for _, a := range b.Applets {
		_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777})
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b.Tar = buf.Bytes()
	return b, nil
}

// KernelCache is where scripts/deps.d/vm.sh extracts the Debian kernel the
// qemu guests boot ($SKEIN_KERNEL_CACHE overrides it); "current" in it
// names the version in use.
func KernelCache() string {
	if d := os.Getenv("SKEIN_KERNEL_CACHE"); d != "" {
		return d
	}
	return "/var/cache/skein/kernel"
}

// FencedBlock returns the first ```lang block of the Markdown file at path
// (a guide whose example a test runs as written).
func FencedBlock(path, lang string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	open := "```" + lang + "\n"
	s := string(b)
	start := strings.Index(s, open)
	if start < 0 {
		return "", fmt.Errorf("%s has no %s block", path, strings.TrimSpace(open))
	}
	s = s[start+len(open):]
	end := strings.Index(s, "```")
	if end < 0 {
		return "", fmt.Errorf("%s: its %s block does not end", path, strings.TrimSpace(open))
	}
	return s[:end], nil
}

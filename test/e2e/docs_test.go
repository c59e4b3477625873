package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
	"github.com/skeinnet/skein/test/tools"
)

// TestDocsInstall runs docs/cni.md's install block as a reader would, on a
// machine that looks fresh, without touching this one: in a private mount
// namespace where /opt, /usr/local/bin, /run and /var/lib are empty tmpfs
// (so /opt/cni/bin does not exist, as on a fresh Debian), and a network
// namespace of its own (skeind's "node"). `make build` is replaced by the
// binaries make built (a bin/ directory beside the script), every other
// line runs as written, skeind included; then skeinctl, as installed,
// must reach skeind on the default socket and see the default pool the
// guide's flag made.
func TestDocsInstall(t *testing.T) {
	harness.RequireRoot(t)
	block, err := tools.FencedBlock(filepath.Join("..", "..", "docs", "cni.md"), "sh")
	if err != nil {
		t.Fatal(err)
	}

	work := t.TempDir()
	if err := os.Symlink(skeintest.Binaries(t), filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, m := range []string{"/opt", "/usr/local/bin", "/run", "/var/lib"} {
		fmt.Fprintf(&script, "mount -t tmpfs tmpfs %s\n", m)
	}
	script.WriteString("ip link set lo up\ncd " + work + "\n")
	n := 0
	for _, line := range strings.Split(block, "\n") {
		cmd := line
		if i := strings.Index(cmd, "#"); i >= 0 {
			cmd = cmd[:i]
		}
		cmd = strings.TrimSpace(cmd)
		switch {
		case cmd == "":
			continue
		case cmd == "make build":
			script.WriteString(": make build: the binaries make built are in ./bin\n")
		case strings.HasPrefix(cmd, "skeind ") && strings.HasSuffix(cmd, "&"):
			script.WriteString(strings.TrimSuffix(cmd, "&") + " >skeind.log 2>&1 &\nskeind=$!\n")
		default:
			script.WriteString(cmd + "\n")
		}
		n++
	}
	if n < 4 {
		t.Fatalf("docs/cni.md's install block has %d commands; the test reads too little", n)
	}
	// The guide's daemon answers skeinctl, as installed, on its default
	// socket; then it stops.
	script.WriteString(`for i in $(seq 100); do [ -S /run/skein/skeind.sock ] && break; sleep 0.1; done
rc=0
skeinctl pool list || rc=$?
kill $skeind; wait $skeind || true
[ $rc = 0 ] || { cat skeind.log; exit $rc; }
`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "--net", "sh", "-c", script.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docs/cni.md's install block failed: %v\nscript:\n%s\noutput:\n%s", err, script.String(), out)
	}
	if !strings.Contains(string(out), "default") || !strings.Contains(string(out), "10.64.0.0/16") {
		t.Fatalf("skeinctl pool list does not show the guide's default pool 10.64.0.0/16:\n%s", out)
	}
	t.Logf("%s", out)
}

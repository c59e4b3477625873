package conformance

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// podman runs the real podman with its CNI backend, all of its state in a
// private directory: storage (--root, --runroot, vfs), --tmpdir, its
// configuration (CONTAINERS_CONF: CNI backend, the plugin directory holding
// skein) and the network configuration directory.
type podman struct {
	bin, dir string
	args     []string
	env      []string
}

func newPodman(t *testing.T, e *env, network string) *podman {
	t.Helper()
	p := &podman{bin: tool(t, "podman"), dir: t.TempDir()}
	tool(t, "runc") // crun refuses this machine's hybrid cgroups; runc works
	tool(t, "conmon")
	netDir := filepath.Join(p.dir, "net.d")
	if err := os.MkdirAll(netDir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [%q]\nnetwork_config_dir = %q\n[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nruntime = \"runc\"\n", e.d.BinDir, netDir)
	if err := os.WriteFile(filepath.Join(p.dir, "containers.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// podman 4.3 embeds libcni 1.1, which speaks spec versions up to 1.0.0.
	list := fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[{"type":"skein","socket":%q}]}`, network, e.d.Socket)
	if err := os.WriteFile(filepath.Join(netDir, network+".conflist"), []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	p.env = []string{"CONTAINERS_CONF=" + filepath.Join(p.dir, "containers.conf")}
	p.args = []string{
		"--root", filepath.Join(p.dir, "root"), "--runroot", filepath.Join(p.dir, "runroot"),
		"--tmpdir", filepath.Join(p.dir, "tmp"), "--storage-driver", "vfs",
		"--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file",
		"--network-backend", "cni", "--network-config-dir", netDir,
	}
	t.Cleanup(func() {
		_, _ = p.cmd(nil, "rm", "-a", "-f", "-t", "0")
		harness.UnmountUnder(p.dir)
		files, _ := filepath.Glob(filepath.Join(cniResultsDir, network+"-*"))
		for _, f := range files {
			os.Remove(f)
		}
	})
	return p
}

func (p *podman) cmd(stdin []byte, args ...string) (string, error) {
	c := exec.Command(p.bin, append(append([]string{}, p.args...), args...)...)
	c.Env = append(os.Environ(), p.env...)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	out, err := c.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (p *podman) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := p.cmd(nil, args...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestPodman runs two busybox containers with podman on a skein network:
// each gets its address on eth0 (the one skeind recorded), they reach each
// other and the node, `podman rm` releases them in skeind, and the host's
// own network never changes.
func TestPodman(t *testing.T) {
	e := newEnv(t)
	network := "skein-pm-" + harness.RandHex(4)
	p := newPodman(t, e, network)
	host := harness.HostNet(t)
	if out, err := p.cmd(skeintest.BusyboxTar(t), "import", "--change", "ENV PATH=/bin", "-", "skein/busybox"); err != nil {
		t.Fatalf("podman import: %v\n%s", err, out)
	}
	if out := p.must(t, "network", "ls", "--format", "{{.Name}}"); !strings.Contains(out, network) {
		t.Fatalf("podman does not see network %s in its CNI config dir: %s", network, out)
	}

	type ctr struct {
		name, id, sandbox string
		addr              netip.Addr
	}
	var ctrs []*ctr
	for _, name := range []string{"a", "b"} {
		c := &ctr{name: network + "-" + name}
		p.must(t, "run", "-d", "--name", c.name, "--network", network,
			"--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--cap-add", "NET_RAW",
			"skein/busybox", "sleep", "600")
		c.id = p.must(t, "inspect", "-f", "{{.Id}}", c.name)
		c.sandbox = p.must(t, "inspect", "-f", "{{.NetworkSettings.SandboxKey}}", c.name)
		ip := p.must(t, "inspect", "-f", fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, network), c.name)
		var err error
		if c.addr, err = netip.ParseAddr(ip); err != nil {
			t.Fatalf("podman reports address %q for %s: %v", ip, c.name, err)
		}
		ctrs = append(ctrs, c)
	}
	atts := e.d.Attachments(t)
	for _, c := range ctrs {
		found := false
		for _, a := range atts {
			if a.ContainerId == c.id && a.Network == network && a.Netns == c.sandbox && strings.Contains(strings.Join(a.Addresses, ","), c.addr.String()) {
				found = true
			}
		}
		if !found {
			t.Errorf("skeind should hold %s/%s/eth0 in %s with %s; it holds %s", network, c.id, c.sandbox, c.addr, keys(atts))
		}
		if out := p.must(t, "exec", c.name, "ip", "-o", "addr", "show", "eth0"); !strings.Contains(out, c.addr.String()+"/32") {
			t.Errorf("inside %s eth0 should carry %s/32:\n%s", c.name, c.addr, out)
		}
	}
	for _, x := range []struct{ from, to string }{
		{ctrs[0].name, ctrs[1].addr.String()}, {ctrs[1].name, ctrs[0].addr.String()},
		{ctrs[0].name, nodeAddr.String()}, {ctrs[0].name, gw4.String()},
	} {
		if out, err := p.cmd(nil, "exec", x.from, "ping", "-c", "1", "-W", "2", x.to); err != nil {
			t.Errorf("container %s should reach %s: %v\n%s", x.from, x.to, err, out)
		}
	}
	harness.AssertHostSame(t, host, "while podman containers run on skein")

	p.must(t, "rm", "-f", "-t", "0", ctrs[0].name, ctrs[1].name)
	e.assertClean(t, "podman rm")
	for _, c := range ctrs {
		if netns.IsNetNS(c.sandbox) == nil {
			t.Errorf("podman rm should have removed the netns %s", c.sandbox)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(cniResultsDir, network+"-*")); len(left) > 0 {
		t.Errorf("podman's CNI result cache still holds %v after rm", left)
	}
	time.Sleep(100 * time.Millisecond) // let conmon exit before the host is compared
	harness.AssertHostSame(t, host, "after podman rm")
}

package docker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
	"github.com/skeinnet/skein/test/tools"
)

// nodeAddr is an address of the node itself (on its lo) that containers ping.
var nodeAddr = netip.MustParseAddr("198.51.100.1")

// image is the busybox image every engine gets (docker import; no registry).
const image = "skein/busybox"

// pluginDir is where dockerd discovers plugin sockets (not configurable).
const pluginDir = "/run/docker/plugins"

// env is one node namespace with skeind and a Docker engine both serving
// it: dockerd runs inside the node namespace, so the veth peer skein leaves
// there is what Docker moves into containers, and the namespace the test
// runs in (the real host's) is never touched.
type env struct {
	node    *harness.NS
	sk      *skeintest.Daemon
	driver  string // plugin name: -d and --ipam-driver
	dir     string
	sock    string // dockerd's API socket
	dockerd *exec.Cmd
	dlog    *bytes.Buffer
	ddone   chan struct{}
	// base is the node namespace with both daemons up and nothing else.
	base harness.State
}

// dockerCLI prefers the newer client; both speak API 1.41.
func dockerCLI() string { return tools.DockerCLI() }

func requireDocker(t testing.TB) {
	t.Helper()
	harness.RequireRoot(t)
	for _, b := range []string{"dockerd", dockerCLI(), "containerd", "runc", skeintest.Busybox} {
		skeintest.RequireTool(t, b)
	}
}

// newEnv starts skeind (with the Docker plugin under a unique name) and a
// dockerd in a new node namespace. The host's network is compared before
// and after the test.
func newEnv(t testing.TB) *env {
	t.Helper()
	requireDocker(t)
	hostBefore := harness.HostNet(t)
	t.Cleanup(func() { harness.AssertHostSame(t, hostBefore, "after the test") })

	e := &env{node: harness.NewNS(t, "dknode"), driver: "skein-" + harness.RandHex(4)}
	e.node.AddAddr(t, "lo", netip.PrefixFrom(nodeAddr, 32))
	plugin := filepath.Join(pluginDir, e.driver+".sock")
	t.Cleanup(func() { os.Remove(plugin) })
	e.sk = skeintest.StartDaemon(t, skeintest.Options{Node: e.node, Args: []string{"--docker-socket", plugin}})

	var err error
	if e.dir, err = os.MkdirTemp("", "skdocker-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		harness.UnmountUnder(e.dir)
		os.RemoveAll(e.dir)
	})
	e.sock = filepath.Join(e.dir, "docker.sock")
	e.startDockerd(t)
	t.Cleanup(func() { e.stopDockerd(t) })
	e.importImage(t)
	e.base = nodeState(t, e.sk)
	return e
}

// startDockerd runs dockerd inside the node namespace, as TESTBED.md says:
// its own roots and socket, no default bridge, no iptables or forwarding
// changes. (Not `ip netns exec`: it remounts /sys, hiding the cgroups.)
func (e *env) startDockerd(t testing.TB) {
	t.Helper()
	e.dlog = &bytes.Buffer{}
	e.dockerd = exec.Command("dockerd", tools.DockerdArgs(e.dir, e.sock)...)
	e.dockerd.Stdout, e.dockerd.Stderr = e.dlog, e.dlog
	if err := e.node.Do(e.dockerd.Start); err != nil {
		t.Fatalf("start dockerd in %s: %v", e.node.Name(), err)
	}
	e.ddone = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(e.dockerd, e.ddone)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-e.ddone:
			t.Fatalf("dockerd exited at start:\n%s", e.dlog.String())
		default:
		}
		if _, err := e.docker("version"); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("dockerd did not answer within 60s:\n%s", tail(e.dlog.String(), 30))
}

// stopDockerd removes every container (SIGKILL: busybox as PID 1 ignores
// SIGTERM) and stops dockerd.
func (e *env) stopDockerd(t testing.TB) {
	select {
	case <-e.ddone:
		return
	default:
	}
	if ids, err := e.docker("ps", "-aq"); err == nil && strings.TrimSpace(ids) != "" {
		e.docker(append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
	}
	_ = e.dockerd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.ddone:
	case <-time.After(30 * time.Second):
		_ = e.dockerd.Process.Kill()
		<-e.ddone
		t.Errorf("dockerd did not exit on SIGTERM")
	}
	if t.Failed() {
		t.Logf("dockerd log (tail):\n%s", tail(e.dlog.String(), 40))
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// importImage gives the engine the busybox image (skeintest.BusyboxTar).
func (e *env) importImage(t testing.TB) {
	t.Helper()
	cmd := exec.Command(dockerCLI(), "-H", "unix://"+e.sock, "import", "--change", "ENV PATH=/bin", "-", image)
	cmd.Stdin = bytes.NewReader(skeintest.BusyboxTar(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker import: %v\n%s", err, out)
	}
}

// docker runs the CLI against this engine and returns its combined output.
func (e *env) docker(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, dockerCLI(), append([]string{"-H", "unix://" + e.sock}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

func (e *env) mustDocker(t testing.TB, args ...string) string {
	t.Helper()
	out, err := e.docker(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// wantDockerError runs a command that must fail with a message containing
// every one of want.
func (e *env) wantDockerError(t testing.TB, what string, args []string, want ...string) {
	t.Helper()
	out, err := e.docker(args...)
	if err == nil {
		t.Errorf("%s: docker %s should fail; it printed %q", what, strings.Join(args, " "), out)
		return
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: the error Docker shows should say %q; it is: %s", what, w, out)
		}
	}
}

// network creates a skein network and returns its ID.
func (e *env) network(t testing.TB, name string, flags ...string) string {
	t.Helper()
	args := append([]string{"network", "create", "-d", e.driver, "--ipam-driver", e.driver}, flags...)
	return e.mustDocker(t, append(args, name)...)
}

// run starts a long-running container and returns its name.
func (e *env) run(t testing.TB, name string, flags ...string) string {
	t.Helper()
	args := append([]string{"run", "-d", "--name", name}, flags...)
	e.mustDocker(t, append(args, image, "sleep", "600")...)
	return name
}

// addrs returns a container's addresses on network net, from docker inspect.
func (e *env) addrs(t testing.TB, ctr, net string) []netip.Addr {
	t.Helper()
	var nets map[string]struct {
		IPAddress, GlobalIPv6Address, Gateway, IPv6Gateway, EndpointID string
	}
	if err := json.Unmarshal([]byte(e.mustDocker(t, "inspect", "-f", "{{json .NetworkSettings.Networks}}", ctr)), &nets); err != nil {
		t.Fatal(err)
	}
	n, ok := nets[net]
	if !ok {
		t.Fatalf("container %s is not on network %s", ctr, net)
	}
	var out []netip.Addr
	for _, s := range []string{n.IPAddress, n.GlobalIPv6Address} {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// ping pings addr from inside a container (busybox ping, as a user would).
func (e *env) ping(t testing.TB, from string, to netip.Addr) {
	t.Helper()
	var err error
	for i := 0; i < 3; i++ {
		if _, err = e.docker("exec", from, "ping", "-c1", "-W2", to.String()); err == nil {
			return
		}
	}
	t.Errorf("%s should reach %s: %v", from, to, err)
}

// dockerAttachments lists skeind's attachments made by the Docker front door.
func (e *env) dockerAttachments(t testing.TB) []*rpc.Attachment {
	t.Helper()
	var out []*rpc.Attachment
	for _, a := range e.sk.Attachments(t) {
		if a.Owner == "docker" {
			out = append(out, a)
		}
	}
	return out
}

// endpointAddrs returns the addresses of the endpoint attachment whose
// container column (the endpoint ID) is id.
func (e *env) endpointAddrs(t testing.TB, endpointID string) []netip.Addr {
	t.Helper()
	for _, a := range e.dockerAttachments(t) {
		if a.ContainerId == endpointID && strings.HasPrefix(a.Network, "docker:") {
			var out []netip.Addr
			for _, s := range a.Addresses {
				out = append(out, netip.MustParseAddr(s))
			}
			return out
		}
	}
	t.Fatalf("skeind has no endpoint %s", endpointID)
	return nil
}

func (e *env) pools(t testing.TB) []string {
	t.Helper()
	l, err := e.sk.Admin(t).ListPools(context.Background(), &rpc.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range l.Pools {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// assertClean: no Docker attachment in skeind, only the pools named, and
// the node namespace as it was with both daemons just started.
func (e *env) assertClean(t testing.TB, pools ...string) {
	t.Helper()
	if atts := e.dockerAttachments(t); len(atts) > 0 {
		var s []string
		for _, a := range atts {
			s = append(s, fmt.Sprintf("%s/%s%v", a.Network, a.ContainerId, a.Addresses))
		}
		t.Errorf("skeind still holds Docker attachments: %s", strings.Join(s, ", "))
	}
	want := append([]string{"default"}, pools...)
	slices.Sort(want)
	if got := e.pools(t); !slices.Equal(got, want) {
		t.Errorf("skeind's pools: want %v, have %v", want, got)
	}
	harness.AssertSame(t, e.base, nodeState(t, e.sk))
}

// nodeState snapshots the node, its export table checked against the
// blocks skeind owns (skeintest.Daemon.NodeState): after `network rm` the
// deleted pool's blocks must be gone from it.
func nodeState(t testing.TB, sk *skeintest.Daemon) harness.State {
	t.Helper()
	return sk.NodeState(t)
}

package kubelet

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
	"github.com/skeinnet/skein/test/tools"
)

// DockerImage is the busybox image a node's dockerd gets (docker import).
const DockerImage = "skein.test/busybox:docker"

// Docker engine paths inside a node's mount namespace: all under the
// node's own /var/lib and /run. dockerd 20.10 writes its trust key to
// /etc/docker/key.json whatever it is told, so it runs in a mount
// namespace of its own whose /etc is an overlay over the node's: what it
// writes there lands in the node's directory, and the machine's /etc
// stays as it was.
const (
	dockerSock   = "/run/docker.sock"
	dockerConfig = "/var/lib/skein-node/docker/daemon.json"
	dockerEtc    = "/var/lib/skein-node/docker/etc"
)

// Dockerd is a Docker engine on a node, as an operator runs one beside
// the kubelet: it finds skein's Docker driver at the node's
// /run/docker/plugins/skein.sock, which the skeind DaemonSet serves.
type Dockerd struct {
	n *Node
	p *kube.Process
}

// DockerPrerequisites returns why a node cannot run Docker here, "" if
// it can.
func DockerPrerequisites() string {
	for _, b := range []string{"dockerd", dockerCLI()} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Sprintf("no %s: run scripts/install-deps.sh (make deps) to install docker.io", b)
		}
	}
	return ""
}

// dockerCLI prefers a newer client in /usr/local/bin; both speak API 1.41.
func dockerCLI() string { return tools.DockerCLI() }

// StartDockerd starts dockerd in the node's namespaces (no bridge, no
// iptables: the node's network is skein's) with DockerImage imported,
// and stops it at the end of the test.
func (n *Node) StartDockerd(t testing.TB) *Dockerd {
	t.Helper()
	for _, d := range []string{"var-lib/skein-node/docker/etc/upper", "var-lib/skein-node/docker/etc/work"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "var-lib/skein-node/docker/daemon.json"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &Dockerd{n: n}
	script := fmt.Sprintf("set -e\nmount -t overlay skein-node-etc -o lowerdir=/etc,upperdir=%[1]s/upper,workdir=%[1]s/work /etc\n"+
		"exec dockerd --config-file %[2]s --data-root /var/lib/docker --exec-root /run/docker --pidfile /run/docker.pid -H unix://%[3]s "+
		"--bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false\n", dockerEtc, dockerConfig, dockerSock)
	// Propagation unchanged: the node's /var/lib and /run are shared, so
	// the containers' root filesystems dockerd mounts there reach the
	// node's containerd, which runs them; the overlay on /etc (on the
	// node's root, a slave mount) reaches nobody.
	d.p = n.start(t, "unshare", "--mount", "--propagation", "unchanged", "--", "sh", "-c", script)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of %s dockerd's log:\n%s", n.Name, d.p.Tail(30))
		}
		d.p.Stop(30 * time.Second)
	})
	if err := waitFor(60*time.Second, d.p, func() bool {
		_, err := d.Docker("version", "-f", "{{.Server.Version}}")
		return err == nil
	}); err != nil {
		t.Fatalf("%s: dockerd: %v\n%s", n.Name, err, d.p.Tail(30))
	}
	cmd := n.Command(dockerCLI(), "-H", "unix://"+dockerSock, "import", "--change", "ENV PATH=/bin", "-", DockerImage)
	cmd.Stdin = bytes.NewReader(skeintest.BusyboxTar(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: docker import: %v\n%s", n.Name, err, out)
	}
	return d
}

// Docker runs the docker CLI against the node's engine.
func (d *Dockerd) Docker(args ...string) (string, error) {
	out, err := d.n.Command(dockerCLI(), append([]string{"-H", "unix://" + dockerSock}, args...)...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, s)
	}
	return s, nil
}

// MustDocker is Docker, failing the test on an error.
func (d *Dockerd) MustDocker(t testing.TB, args ...string) string {
	t.Helper()
	out, err := d.Docker(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

package conformance

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// containerd is a private containerd: its own root, state, sockets and a
// configuration that disables the CRI plugin (which would read the host's
// /etc/cni/net.d) and the snapshotters this machine cannot use.
type containerd struct {
	ctr, sock string
}

func startContainerd(t *testing.T) *containerd {
	t.Helper()
	bin := tool(t, "containerd")
	c := &containerd{ctr: tool(t, "ctr")}
	tool(t, "containerd-shim-runc-v2")
	tool(t, "runc")
	dir := t.TempDir()
	c.sock = filepath.Join(dir, "containerd.sock")
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.opt"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, c.sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		harness.UnmountUnder(dir)
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("containerd log:\n%s", b)
		}
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := runErr(nil, c.ctr, "--address", c.sock, "version"); err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not answer on %s within 15s", c.sock)
		}
	}
}

// TestContainerd: a pod netns attached by skein (through libcni, as
// containerd's CRI plugin does) is joined by a container that `ctr run
// --with-ns network:` starts; inside, the process sees eth0 with the
// result's address and the default route, and reaches the node.
func TestContainerd(t *testing.T) {
	e := newEnv(t)
	c := startContainerd(t)
	rootfs := t.TempDir()
	skeintest.BusyboxRootfs(t, rootfs)

	ns := harness.NewNS(t, "pod")
	l := e.list(t, "ctrd", "1.1.0")
	rt := skeintest.RT("ctrd-"+harness.RandHex(4), ns.Path(), "eth0")
	res := e.mustAdd(t, l, rt)
	addrs := addrsOf(res, "eth0")
	if len(addrs) == 0 {
		t.Fatalf("no eth0 address in the result: %v", res)
	}
	id := "skein-" + harness.RandHex(4)
	removeCgroupsAfter(t, "skein-conformance")
	// runc's state under the test's own directory: its default root is
	// /run/containerd/runc/<namespace>, on the host.
	out, err := runErr(nil, c.ctr, "--address", c.sock, "-n", "skein-conformance", "run", "--rm", "--rootfs", "--fifo-dir", t.TempDir(),
		"--runc-root", t.TempDir(),
		"--with-ns", "network:"+ns.Path(), rootfs, id,
		"/bin/sh", "-c", "ip -o addr show eth0; ip route; ping -c1 -W2 "+nodeAddr.String()+" >/dev/null && echo node-reachable")
	if err != nil {
		t.Fatalf("ctr run: %v\n%s", err, out)
	}
	for _, a := range addrs {
		want := a.String() + "/32"
		if a.Is6() {
			want = a.String() + "/128"
		}
		if !strings.Contains(out, want) {
			t.Errorf("the container's process should see %s on eth0; it sees:\n%s", want, out)
		}
	}
	for _, want := range []string{"default via " + gw4.String() + " dev eth0", "node-reachable"} {
		if !strings.Contains(out, want) {
			t.Errorf("the container's process should show %q; output:\n%s", want, out)
		}
	}
	if err := e.cni.DelNetworkList(cctx(t), l, rt); err != nil {
		t.Errorf("DEL: %v", err)
	}
	e.assertClean(t, "DEL after the container ran")
}

// removeCgroupsAfter removes, when the test ends, the cgroup named name in
// every hierarchy where it was not there before: runc puts a container of
// containerd namespace ns in /ns/<id> and removes only <id>.
func removeCgroupsAfter(t *testing.T, name string) {
	t.Helper()
	roots := []string{"/sys/fs/cgroup"} // a unified-only host
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.procs"); err != nil {
		roots, _ = filepath.Glob("/sys/fs/cgroup/*") // one per hierarchy
	}
	var made []string
	for _, r := range roots {
		dir := filepath.Join(r, name)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			made = append(made, dir)
		}
	}
	t.Cleanup(func() {
		for _, dir := range made {
			var err error
			for try := 0; try < 50; try++ {
				if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Errorf("cgroup left: %v", err)
			}
		}
	})
}

package kubelet

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
)

// Paths inside a node's mount namespace. /var/lib and /var/log are the
// node's own directories, /run a tmpfs of its own, so containerd, the
// kubelet and every hostPath volume of its pods see only the node's
// files; the host's stay as they were.
const (
	// NodeCNIBinDir and NodeCNIConfDir are the node's CNI directories:
	// containerd's bin_dir and conf_dir, and the hostPaths the test
	// overlay gives skeind's installer.
	NodeCNIBinDir  = "/var/lib/skein-node/cni/bin"
	NodeCNIConfDir = "/var/lib/skein-node/cni/net.d"
	containerdSock = "/run/containerd/containerd.sock"
	imagesDir      = "/var/lib/skein-node/images"
)

// Node is one Kubernetes node: a network namespace on the cluster's
// bridge, and a mount namespace holding its containerd, kubelet and
// kube-proxy.
type Node struct {
	Name string
	// NS is the node's network namespace (the pods' veths end here).
	NS *harness.NS
	// IPv4 and IPv6 are the node's addresses on the underlay.
	IPv4, IPv6 string
	// Dir is the node's directory on the host (its /var/lib, /var/log,
	// configuration and logs).
	Dir string

	cgroup     string // the kubelet's cgroupRoot, in every v1 hierarchy
	holder     *kube.Process
	containerd *kube.Process
	kubelet    *kube.Process
	proxy      *kube.Process
}

// sysctls the kubelet sets to its liking at start: the node's mount
// namespace binds files holding these values over them, so the kubelet
// writes its own copies, not the host's.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// startNamespace starts the process holding the node's mount namespace
// (unshare, slave propagation: the host's later mounts reach the node, the
// node's never reach the host) with its private /run, /var/lib, /var/log
// and sysctl copies.
func (n *Node) startNamespace(t testing.TB) {
	t.Helper()
	for _, d := range []string{"var-lib/skein-node/cni/bin", "var-lib/skein-node/cni/net.d", "var-lib/skein-node/images", "var-log", "sysctl", "etc"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A node's CNI directory holds the reference plugins as the
	// distribution's package leaves them (containerd before 2.0 runs
	// loopback itself for every pod); skeind's installer adds skein's.
	for _, p := range []string{"loopback", "bridge", "host-local", "portmap"} {
		src := filepath.Join(ReferencePluginDir, p)
		if err := copyFile(src, filepath.Join(n.Dir, "var-lib/skein-node/cni/bin", p)); err != nil {
			t.Fatalf("%s: the reference CNI plugin %s: %v", n.Name, p, err)
		}
	}
	var script strings.Builder
	// The host's mounts under /run go first (its /run/netns and the
	// namespaces pinned there): hidden under the node's tmpfs they would
	// still be in mountinfo, where the runtime takes the host's /run/netns
	// (not shared in here) for the node's.
	script.WriteString("set -e\nif mountpoint -q /run/netns; then umount --recursive --lazy /run/netns; fi\n")
	script.WriteString("mount -t tmpfs -o mode=0755 skein-node-run /run\nmkdir -p /run/netns /run/lock\n")
	fmt.Fprintf(&script, "mount --bind %s /var/lib\nmount --bind %s /var/log\n", filepath.Join(n.Dir, "var-lib"), filepath.Join(n.Dir, "var-log"))
	// Shared inside the node, as on a host: a pod's Bidirectional
	// hostPath (skeind's /run/netns) needs a shared source, and the
	// runtime's later mounts of pods' namespaces must reach it. The
	// peer groups are new, so nothing reaches the host.
	script.WriteString("mount --make-rshared /run\nmount --make-rshared /var/lib\n")
	// As iproute2 leaves it: the netns directory a shared mount of its own.
	script.WriteString("mount --bind /run/netns /run/netns\nmount --make-shared /run/netns\n")
	for k, v := range kubeletSysctls {
		f := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&script, "mount --bind %s /proc/sys/%s\n", f, k)
	}
	ready := filepath.Join(n.Dir, "namespace-ready")
	fmt.Fprintf(&script, "echo ok > %s\nexec sleep infinity\n", ready)
	p, err := kube.StartProcess(n.Name+" namespace", "nsenter",
		[]string{"--net=" + n.NS.Path(), "--", "unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script.String()},
		filepath.Join(n.Dir, "namespace.log"))
	if err != nil {
		t.Fatal(err)
	}
	n.holder = p
	if err := waitFor(30*time.Second, p, func() bool { _, err := os.Stat(ready); return err == nil }); err != nil {
		t.Fatalf("%s: mount namespace: %v\n%s", n.Name, err, p.Tail(20))
	}
}

// Command returns a command running name with args in the node's network
// and mount namespaces.
func (n *Node) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"-t", strconv.Itoa(n.holder.Pid()), "-m", "-n", "--", name}, args...)...)
}

// start runs a daemon of the node in its namespaces, its log in Dir.
func (n *Node) start(t testing.TB, name string, args ...string) *kube.Process {
	t.Helper()
	p, err := kube.StartProcess(n.Name+" "+filepath.Base(name), "nsenter",
		append([]string{"-t", strconv.Itoa(n.holder.Pid()), "-m", "-n", "--", name}, args...),
		filepath.Join(n.Dir, filepath.Base(name)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// containerdConfig is the node's containerd: its own root, state and
// socket (under the node's /var/lib and /run), runc's state under it too,
// the pause image made here, and the node's CNI directories. The opt
// plugin (which would make /opt/containerd on the host) is off.
func containerdConfig() string {
	return `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "` + containerdSock + `"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + PauseImage + `"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "/run/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "` + NodeCNIBinDir + `"
    conf_dir = "` + NodeCNIConfDir + `"
    max_conf_num = 1
`
}

// startContainerd starts the node's containerd and imports images into
// its k8s.io namespace.
func (n *Node) startContainerd(t testing.TB, imageTars []string) {
	t.Helper()
	cfg := filepath.Join(n.Dir, "etc", "containerd.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	n.containerd = n.start(t, "containerd", "--config", cfg)
	err := waitFor(60*time.Second, n.containerd, func() bool {
		return n.Command("ctr", "--address", containerdSock, "version").Run() == nil
	})
	if err != nil {
		t.Fatalf("%s: containerd: %v\n%s", n.Name, err, n.containerd.Tail(30))
	}
	for _, tar := range imageTars {
		n.ImportImage(t, tar)
	}
}

// ImportImage imports an image tarball into the node's containerd (the
// kubelet's namespace, k8s.io), as a registry-less node gets images.
func (n *Node) ImportImage(t testing.TB, tar string) {
	t.Helper()
	dst := filepath.Join(n.Dir, "var-lib/skein-node/images", filepath.Base(tar))
	if err := os.Link(tar, dst); err != nil {
		if err := copyFile(tar, dst); err != nil {
			t.Fatal(err)
		}
	}
	out, err := n.Command("ctr", "--address", containerdSock, "-n", "k8s.io", "images", "import",
		"--no-unpack", filepath.Join(imagesDir, filepath.Base(tar))).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: import %s: %v\n%s", n.Name, tar, err, out)
	}
}

// kubeletConfig is the node's KubeletConfiguration: cgroupfs (cgroup v1
// here), the node's own cgroup root, its containerd, anonymous access to
// its API on the node's address (the test's API server is its only
// client), no image GC (the images cannot be pulled again).
func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: true
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
address: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
maxPods: 250
nodeStatusUpdateFrequency: 4s
`, n.cgroup, containerdSock, n.IPv4)
}

// startKubelet starts the node's kubelet with the node's credentials.
func (n *Node) startKubelet(t testing.TB, kubeconfig string) {
	t.Helper()
	if err := n.makeCgroups(); err != nil {
		t.Fatalf("%s: cgroups: %v", n.Name, err)
	}
	cfg := filepath.Join(n.Dir, "etc", "kubelet.yaml")
	if err := os.WriteFile(cfg, []byte(n.kubeletConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	n.kubelet = n.start(t, filepath.Join(kube.AssetsDir(), "kubelet"),
		"--config="+cfg,
		"--kubeconfig="+kubeconfig,
		"--root-dir=/var/lib/kubelet",
		"--cert-dir=/var/lib/kubelet/pki",
		"--hostname-override="+n.Name,
		"--node-ip="+n.IPv4+","+n.IPv6,
		"--v=1")
}

// proxyConfig is the node's kube-proxy in mode (iptables or nftables),
// leaving the conntrack sysctls alone.
func (n *Node) proxyConfig(kubeconfig, mode, clusterCIDR string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
mode: %s
clusterCIDR: %s
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, n.Name, mode, clusterCIDR)
}

// startProxy starts (or restarts) the node's kube-proxy in mode.
func (n *Node) startProxy(t testing.TB, kubeconfig, mode, clusterCIDR string) {
	t.Helper()
	if n.proxy != nil {
		n.proxy.Stop(10 * time.Second)
	}
	cfg := filepath.Join(n.Dir, "etc", "kube-proxy.yaml")
	if err := os.WriteFile(cfg, []byte(n.proxyConfig(kubeconfig, mode, clusterCIDR)), 0o644); err != nil {
		t.Fatal(err)
	}
	n.proxy = n.start(t, filepath.Join(kube.AssetsDir(), "kube-proxy"), "--config="+cfg, "--v=1")
}

// cgroupMounts returns the mount points of the cgroup v1 hierarchies, and
// with unified set also of the v2 one: on a hybrid host the kubelet's
// cgroupfs driver and runc make the node's tree there too (unmanaged: no
// controllers), and it must go with the node.
func cgroupMounts(unified bool) ([]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && (fields[2] == "cgroup" || unified && fields[2] == "cgroup2") {
			dirs = append(dirs, fields[1])
		}
	}
	return dirs, sc.Err()
}

// makeCgroups makes the kubelet's cgroup root in every v1 hierarchy,
// with the root's CPUs and memory nodes in cpuset.
func (n *Node) makeCgroups() error {
	mounts, err := cgroupMounts(false)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		dir := filepath.Join(m, n.cgroup)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(m, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
				}
			}
		}
	}
	return nil
}

// stop ends the node: the kubelet and kube-proxy first, then every
// process of its pods (by cgroup) and of its mount namespace (containerd
// and its shims), then its cgroups. The mount namespace, and with it every
// mount the node made, goes with its last process.
func (n *Node) stop(t testing.TB) {
	for _, p := range []*kube.Process{n.kubelet, n.proxy} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	var mntNS string
	if n.holder != nil && !n.holder.Exited() {
		mntNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", n.holder.Pid()))
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		pids := n.processes(mntNS)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: processes left after 20 s: %v", n.Name, pids)
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range []*kube.Process{n.containerd, n.holder} {
		if p != nil {
			p.Stop(5 * time.Second)
		}
	}
	if err := n.removeCgroups(); err != nil {
		t.Errorf("%s: %v", n.Name, err)
	}
	if mounts, err := cgroupMounts(true); err == nil {
		for _, m := range mounts {
			if _, err := os.Stat(filepath.Join(m, n.cgroup)); err == nil {
				t.Errorf("%s: its cgroup %s is left", n.Name, filepath.Join(m, n.cgroup))
			}
		}
	}
}

// processes lists the processes of the node: in its cgroup tree or its
// mount namespace, except the holder of that namespace (stopped last).
func (n *Node) processes(mntNS string) []int {
	seen := map[int]bool{}
	if mounts, err := cgroupMounts(true); err == nil {
		for _, m := range mounts {
			_ = filepath.Walk(filepath.Join(m, n.cgroup), func(p string, info os.FileInfo, err error) error {
				if err != nil || info.IsDir() || info.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						seen[pid] = true
					}
				}
				return nil
			})
		}
	}
	if mntNS != "" {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); l == mntNS {
				seen[pid] = true
			}
		}
	}
	if n.holder != nil {
		delete(seen, n.holder.Pid())
	}
	var pids []int
	for pid := range seen {
		pids = append(pids, pid)
	}
	return pids
}

// removeCgroups removes the node's cgroup tree, deepest first, from every
// hierarchy.
func (n *Node) removeCgroups() error {
	mounts, err := cgroupMounts(true)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		root := filepath.Join(m, n.cgroup)
		var dirs []string
		_ = filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 50; try++ {
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// waitFor polls ok every 200 ms until it holds, p exits or timeout passes.
func waitFor(timeout time.Duration, p *kube.Process, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ok() {
		if p != nil && p.Exited() {
			return errors.New("the process exited")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// ReferencePluginDir is where Debian's containernetworking-plugins
// package puts the reference plugins.
const ReferencePluginDir = "/usr/lib/cni"

// copyFile copies src to dst with src's permission bits.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, fi.Mode().Perm())
}

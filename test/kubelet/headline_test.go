package kubelet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/test/skeintest"
)

// vmPod is a VM as a pod: qemu (TCG) in the pod's container, started by
// skein-vmwrapper with the pod's tap, which skein-vm made because of the
// annotation. The guest pings targets and reports on the console (the
// pod's log).
func vmPod(name, node string, targets []netip.Addr) string {
	var ts []string
	for _, a := range targets {
		ts = append(ts, a.String())
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
  annotations:
    skein.dev/vm: "true"
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: vm
    image: %s
    args: ["-accel", "tcg", "-m", "192", "-nodefaults", "-device", "virtio-rng-pci", "-display", "none", "-serial", "stdio", "-no-reboot",
           "-kernel", "%s", "-initrd", "%s", "-append", "console=ttyS0 panic=-1 quiet skein.ping=%s"]
    env:
    - {name: SKEIN_VM_IN_POD, value: "1"}
    - {name: SKEIN_VM_NIC_OPTS, value: "romfile="}
    volumeMounts:
    - {name: vm-socket, mountPath: /run/skein/vm.sock}
  volumes:
  - name: vm-socket
    hostPath: {path: /run/skein/vm.sock, type: Socket}
`, name, node, VMImage, vmKernel, vmInitrd, strings.Join(ts, ","))
}

// TestKubeletHeadline is what no other system does, on a real cluster: a
// Docker container started by a node's own dockerd (skein's Docker
// driver, --ipam-opt skein.pool=default, served by that node's skeind in
// Kubernetes mode), a VM run as a pod on the other node (qemu in the pod
// through skein-vm, chained in the node's conflist for pods annotated
// skein.dev/vm) and ordinary pods get distinct addresses of the
// cluster's pool and reach each other across the nodes, both families.
func TestKubeletHeadline(t *testing.T) {
	if why := Prerequisites(); why != "" {
		t.Skipf("skipping: a Kubernetes node %s", why)
	}
	if why := DockerPrerequisites(); why != "" {
		t.Skipf("skipping: %s", why)
	}
	if why := VMPrerequisites(); why != "" {
		t.Skipf("skipping: a VM pod needs %s", why)
	}
	c := Start(t, Options{})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	n2.ImportImage(t, vmImage(t, c.Dir, skeintest.Binaries(t), c.Root))
	c.Install(t, filepath.Join(c.Root, "test", "kubelet", "overlay-vm"))
	c.CreatePool(t, "default", "10.244.0.0/24", "fd00:244::/120", 4)
	c.WaitNodesReady(t)

	c.Apply(t, annotated("p1", n1.Name, "")+annotated("p2", n2.Name, ""))
	c.Kubectl(t, "wait", "--for=condition=Ready", "pod/p1", "pod/p2", "--timeout=120s")
	pod := func(name string) corev1.Pod {
		var p corev1.Pod
		if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p1, p2 := pod("p1"), pod("p2")
	for _, p := range []corev1.Pod{p1, p2} {
		if links := c.Kubectl(t, "exec", p.Name, "--", "ip", "-o", "link"); strings.Contains(links, "skbr") || strings.Contains(links, "sktap") {
			t.Errorf("pod %s is not annotated as a VM but has skein-vm's links:\n%s", p.Name, links)
		}
	}

	// Docker on node 1, on the cluster's pool.
	d := n1.StartDockerd(t)
	// As docs/kubernetes.md tells a reader to: its two commands as written
	// (the container named, the image the node has).
	create, run := guideDockerCommands(t)
	d.MustDocker(t, create...)
	for i, a := range run {
		if a == "busybox" {
			run[i] = DockerImage
		}
	}
	d.MustDocker(t, append([]string{"run", "--name", "ctr1"}, run[1:]...)...)
	t.Cleanup(func() { _, _ = d.Docker("rm", "-f", "ctr1"); _, _ = d.Docker("network", "rm", "kubenet") })
	var ctr []netip.Addr
	for _, s := range strings.Fields(d.MustDocker(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.GlobalIPv6Address}}{{end}}", "ctr1")) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			t.Fatalf("docker inspect ctr1: %q: %v", s, err)
		}
		ctr = append(ctr, a)
	}
	if len(ctr) != 2 || !ctr[0].Is4() || !ctr[1].Is6() {
		t.Fatalf("the Docker container has addresses %v, want one IPv4 and one IPv6", ctr)
	}
	t.Logf("Docker container ctr1 on %s: %v", n1.Name, ctr)

	// The VM pod on node 2 pings p1 (node 1) and the Docker container.
	targets := append(PodAddrs(&p1), ctr...)
	c.Apply(t, vmPod("vm", n2.Name, targets))
	if out, err := c.Env.Kubectl("wait", "--for=condition=Ready", "pod/vm", "--timeout=120s"); err != nil {
		logs, _ := c.Env.Kubectl("logs", "vm")
		prev, _ := c.Env.Kubectl("logs", "vm", "--previous")
		t.Fatalf("the VM pod is not Ready: %v\n%s\nits log:\n%s\nits previous log:\n%s", err, out, logs, prev)
	}
	var console string
	waitCond(t, 240*time.Second, "the VM's console to report SKEIN-VM-READY", func() (bool, string) {
		out, err := c.Env.Kubectl("logs", "vm")
		console = string(out)
		return err == nil && strings.Contains(console, "SKEIN-VM-READY"), console
	})
	vm := pod("vm")
	vmAddrs := PodAddrs(&vm)
	t.Logf("VM pod on %s: %v; console:\n%s", n2.Name, vmAddrs, report(console))
	if len(vmAddrs) != 2 {
		t.Fatalf("the VM pod has addresses %v, want one per family", vmAddrs)
	}
	want := []string{"SKEIN-VM-LEASE4-OK", "SKEIN-VM-LEASE6-OK"}
	for _, a := range vmAddrs {
		bits := 32
		if a.Is6() {
			bits = 128
		}
		want = append(want, fmt.Sprintf("SKEIN-VM addr %s/%d", a, bits))
	}
	for _, a := range targets {
		want = append(want, "SKEIN-VM-PING-OK "+a.String())
	}
	for _, w := range want {
		if !strings.Contains(console, w+"\n") {
			t.Errorf("the VM's console lacks %q", w)
		}
	}

	// Every address distinct, all of the pool.
	seen := map[netip.Addr]string{}
	for who, addrs := range map[string][]netip.Addr{"p1": PodAddrs(&p1), "p2": PodAddrs(&p2), "ctr1": ctr, "vm": vmAddrs} {
		for _, a := range addrs {
			if !netip.MustParsePrefix("10.244.0.0/24").Contains(a) && !netip.MustParsePrefix("fd00:244::/120").Contains(a) {
				t.Errorf("%s: %v is outside the pool", who, a)
			}
			if other, dup := seen[a]; dup {
				t.Errorf("%v is on %s and %s", a, other, who)
			}
			seen[a] = who
		}
	}

	// The other directions: pods reach the VM and the Docker container,
	// the Docker container reaches the VM and the pod on the other node.
	for _, a := range vmAddrs {
		podPing(t, c, "p1", a)
	}
	for _, a := range ctr {
		podPing(t, c, "p2", a)
	}
	for _, a := range append(append([]netip.Addr{}, vmAddrs...), PodAddrs(&p2)...) {
		waitCond(t, 20*time.Second, fmt.Sprintf("ping %v from the Docker container", a), func() (bool, string) {
			out, err := d.Docker("exec", "ctr1", "ping", "-c", "1", "-W", "2", a.String())
			return err == nil && strings.Contains(out, " 0% packet loss"), out
		})
	}

	// Gone again: the Docker container, its network and the VM pod leave
	// no record on either node.
	d.MustDocker(t, "rm", "-f", "ctr1")
	d.MustDocker(t, "network", "rm", "kubenet")
	c.Kubectl(t, "delete", "pod", "vm", "--wait=true", "--timeout=60s")
	for _, n := range []*Node{n1, n2} {
		// What is left is the node's one plain pod.
		waitCond(t, 30*time.Second, n.Name+"'s records to be its plain pod's alone", func() (bool, string) {
			recs := c.Attachments(t, n)
			return len(recs) == 1 && recs[0]["owner"] == "cni", fmt.Sprint(recs)
		})
	}
	if out, err := n2.Command("sh", "-c", "ls /run/skein/vm-tokens 2>/dev/null").CombinedOutput(); err == nil && strings.TrimSpace(string(out)) != "" {
		t.Errorf("%s: VM tokens left: %s", n2.Name, out)
	}
}

// podPing pings a from pod (retrying for a while: a route or a guest's
// address may still be settling).
func podPing(t *testing.T, c *Cluster, pod string, a netip.Addr) {
	t.Helper()
	waitCond(t, 20*time.Second, fmt.Sprintf("ping %v from %s", a, pod), func() (bool, string) {
		out, err := c.Env.Kubectl("exec", pod, "--", "ping", "-c", "1", "-W", "2", a.String())
		return err == nil && strings.Contains(string(out), " 0% packet loss"), string(out)
	})
}

// report keeps the guest's SKEIN-VM lines of a console.
func report(console string) string {
	var out []string
	for _, l := range strings.Split(console, "\n") {
		if strings.HasPrefix(l, "SKEIN-VM") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// guideDockerCommands returns the docker commands of docs/kubernetes.md's
// Docker example (its block that creates the network "kubenet"), each
// without the leading "docker": the network create and the run.
func guideDockerCommands(t *testing.T) (create, run []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 3 && f[0] == "docker" && f[1] == "network" && f[2] == "create" && f[len(f)-1] == "kubenet":
			create = f[1:]
		case len(f) > 2 && f[0] == "docker" && f[1] == "run" && slices.Contains(f, "kubenet"):
			run = f[1:]
		}
	}
	if create == nil || run == nil {
		t.Fatal("docs/kubernetes.md has no docker network create … kubenet and docker run --net kubenet lines")
	}
	return create, run
}

package kubelet

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pinged is a pod pinned to a node, sleeping.
func pinned(name, node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
  labels: {app: pinned}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    command: ["sleep", "100000"]
---
`, name, node, BusyboxImage)
}

// TestKubeletNodeOperations does to a running cluster what operators do,
// with pods on both nodes pinging each other throughout: skeind's
// DaemonSet rolled to a new image (no pod changes address; the longest
// gap in the pings is measured, the goal 0 lost since skeind is not in
// the data path), the routing mode switched to direct, a node's
// containerd and kubelet killed and started again (pods keep their
// addresses, no address leaks), and a node drained (its pods' veths and
// records gone).
func TestKubeletNodeOperations(t *testing.T) {
	c := Start(t, Options{})
	c.Install(t, c.Root+"/test/kubelet/overlay")
	c.CreatePool(t, "default", "10.244.0.0/24", "fd00:244::/120", 4)
	c.WaitNodesReady(t)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	c.Apply(t, pinned("a", n1.Name)+pinned("b", n2.Name))
	c.Kubectl(t, "wait", "--for=condition=Ready", "pod/a", "pod/b", "--timeout=120s")
	a, b := c.Pod(t, "a"), c.Pod(t, "b")
	addrs := map[string][]netip.Addr{"a": PodAddrs(a), "b": PodAddrs(b)}
	bv4 := addrs["b"][0].String()

	t.Run("upgrade", func(t *testing.T) {
		for _, n := range c.Nodes {
			out, err := n.Command("ctr", "--address", containerdSock, "-n", "k8s.io", "images", "tag", "--force",
				"docker.io/library/"+SkeinImage, "docker.io/library/skein:next").CombinedOutput()
			if err != nil {
				t.Fatalf("%s: tag the new image: %v\n%s", n.Name, err, out)
			}
		}
		pinger := c.StartPing(t, "a", bv4)
		c.Kubectl(t, "-n", "skein-system", "set", "image", "daemonset/skeind", "skeind=skein:next", "install-cni=skein:next")
		c.Kubectl(t, "-n", "skein-system", "rollout", "status", "daemonset/skeind", "--timeout=180s")
		// The controller too: two replicas on host ports, one per node, so
		// the rollout must replace them one at a time (a surge pod would
		// find no node and wait forever).
		c.Kubectl(t, "-n", "skein-system", "set", "image", "deployment/skein-controller", "controller=skein:next")
		c.Kubectl(t, "-n", "skein-system", "rollout", "status", "deployment/skein-controller", "--timeout=180s")
		// Pings a little past the end of the rollout.
		time.Sleep(2 * time.Second)
		r := pinger.Stop(t)
		t.Logf("pings from a to b (%s) across skeind's rollout: %d sent, %d lost, longest gap %v", bv4, r.Sent, r.Lost, r.LongestGap)
		if r.Sent < 20 {
			t.Errorf("only %d pings were sent: the measurement is void", r.Sent)
		}
		if r.Lost > 0 {
			t.Errorf("%d of %d pings lost while skeind was upgraded (longest gap %v): skeind is not in the data path", r.Lost, r.Sent, r.LongestGap)
		}
		c.checkAddrs(t, addrs)
	})

	t.Run("direct routing", func(t *testing.T) {
		c.Kubectl(t, "-n", "skein-system", "patch", "daemonset/skeind", "--type=json",
			`-p=[{"op":"replace","path":"/spec/template/spec/containers/0/args/3","value":"--routing=direct"}]`)
		out := c.Kubectl(t, "-n", "skein-system", "get", "daemonset/skeind", "-o", "jsonpath={.spec.template.spec.containers[0].args}")
		if !strings.Contains(out, "--routing=direct") || strings.Contains(out, "--routing=vxlan") {
			t.Fatalf("skeind's args after the patch: %s", out)
		}
		c.Kubectl(t, "-n", "skein-system", "rollout", "status", "daemonset/skeind", "--timeout=180s")
		for _, dst := range addrs["b"] {
			waitCond(t, 30*time.Second, fmt.Sprintf("direct routing: ping %s from a", dst), func() (bool, string) {
				out, err := c.Env.Kubectl("exec", "a", "--", "ping", "-c", "1", "-W", "2", dst.String())
				return err == nil && strings.Contains(string(out), " 0% packet loss"), string(out)
			})
		}
		for _, n := range c.Nodes {
			out, err := n.Command("ip", "-o", "link", "show", "skein.vxlan").CombinedOutput()
			if err == nil {
				t.Errorf("%s: the VXLAN device stayed after the switch to direct routing: %s", n.Name, out)
			}
		}
		c.checkAddrs(t, addrs)
	})

	t.Run("node restart", func(t *testing.T) {
		for _, p := range []interface {
			Pid() int
			Done() <-chan struct{}
		}{n2.kubelet, n2.containerd} {
			_ = syscall.Kill(p.Pid(), syscall.SIGKILL)
			<-p.Done()
		}
		n2.startContainerd(t, nil)
		kc, err := c.Env.WriteKubeconfig("system:node:" + n2.Name)
		if err != nil {
			t.Fatal(err)
		}
		n2.startKubelet(t, kc)
		// The kubelet serves b again once it has found its containers.
		waitCond(t, 90*time.Second, "kubectl exec b after the restart", func() (bool, string) {
			out, err := c.Env.Kubectl("exec", "b", "--", "true")
			return err == nil, string(out)
		})
		c.Kubectl(t, "wait", "--for=condition=Ready", "pod/b", "--timeout=120s")
		c.checkAddrs(t, addrs)
		out := c.Kubectl(t, "exec", "a", "--", "ping", "-c", "2", "-W", "3", bv4)
		if !strings.Contains(out, " 0% packet loss") {
			t.Errorf("ping b after its node restarted:\n%s", out)
		}
		// Every record on the node is a pod that runs there.
		waitCond(t, 60*time.Second, n2.Name+": records = pods", func() (bool, string) {
			recs := len(c.Attachments(t, n2))
			pods := c.podsWithAddrs(t, n2.Name)
			return recs == pods, fmt.Sprintf("%d records, %d pods with addresses", recs, pods)
		})
	})

	t.Run("drain", func(t *testing.T) {
		c.Kubectl(t, "drain", n2.Name, "--ignore-daemonsets", "--force", "--delete-emptydir-data", "--timeout=120s")
		waitCond(t, 60*time.Second, n2.Name+": no records after the drain", func() (bool, string) {
			recs := c.Attachments(t, n2)
			return len(recs) == 0, fmt.Sprint(recs)
		})
		out, err := n2.Command("ip", "-o", "link", "show", "type", "veth").CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" && !strings.Contains(l, " eth0@") {
				t.Errorf("%s: a veth left after the drain: %s", n2.Name, l)
			}
		}
		c.Kubectl(t, "uncordon", n2.Name)
	})
}

// Pod returns the pod name in the default namespace.
func (c *Cluster) Pod(t testing.TB, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// checkAddrs checks that each pod still has the addresses it had, in the
// API and on its eth0.
func (c *Cluster) checkAddrs(t testing.TB, want map[string][]netip.Addr) {
	t.Helper()
	for name, addrs := range want {
		if got := PodAddrs(c.Pod(t, name)); !slices.Equal(got, addrs) {
			t.Errorf("pod %s: addresses %v, were %v", name, got, addrs)
		}
		out := c.Kubectl(t, "exec", name, "--", "ip", "-o", "addr", "show", "dev", "eth0")
		for _, a := range addrs {
			if !strings.Contains(out, " "+a.String()+"/") {
				t.Errorf("pod %s: %v is no longer on its eth0:\n%s", name, a, out)
			}
		}
	}
}

// podsWithAddrs counts the pods on node that have a pod-network address.
func (c *Cluster) podsWithAddrs(t testing.TB, node string) int {
	t.Helper()
	var list corev1.PodList
	if err := c.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range list.Items {
		if p.Spec.NodeName == node && !p.Spec.HostNetwork && p.DeletionTimestamp == nil && len(p.Status.PodIPs) > 0 {
			n++
		}
	}
	return n
}

// Pinger is a ping running in a pod until Stop.
type Pinger struct {
	c        *Cluster
	pod      string
	done     chan struct{}
	out      string
	err      error
	interval time.Duration
}

// PingResult is what a Pinger saw.
type PingResult struct {
	Sent, Lost int
	LongestGap time.Duration
}

// StartPing starts pinging dst from pod every 100 ms.
func (c *Cluster) StartPing(t testing.TB, pod, dst string) *Pinger {
	t.Helper()
	p := &Pinger{c: c, pod: pod, done: make(chan struct{}), interval: 100 * time.Millisecond}
	c.Kubectl(t, "exec", pod, "--", "rm", "-f", "/tmp/stop-ping")
	go func() {
		defer close(p.done)
		// Stopped by /tmp/stop-ping: ping prints its summary on SIGINT.
		out, err := c.Env.Kubectl("exec", pod, "--", "sh", "-c",
			`ping -i 0.1 "$0" & p=$!; while [ ! -e /tmp/stop-ping ]; do sleep 0.2; done; kill -INT $p; wait $p; true`, dst)
		p.out, p.err = string(out), err
	}()
	time.Sleep(time.Second)
	return p
}

var pingSeq = regexp.MustCompile(`seq=(\d+)`)
var pingSent = regexp.MustCompile(`(\d+) packets transmitted`)

// Stop ends the ping and reads its output.
func (p *Pinger) Stop(t testing.TB) PingResult {
	t.Helper()
	p.c.Kubectl(t, "exec", p.pod, "--", "touch", "/tmp/stop-ping")
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the ping did not stop")
	}
	if p.err != nil {
		t.Fatalf("ping: %v\n%s", p.err, p.out)
	}
	m := pingSent.FindStringSubmatch(p.out)
	if m == nil {
		t.Fatalf("ping printed no summary:\n%s", tailLines(p.out, 10))
	}
	var r PingResult
	r.Sent, _ = strconv.Atoi(m[1])
	got := map[int]bool{}
	for _, m := range pingSeq.FindAllStringSubmatch(p.out, -1) {
		n, _ := strconv.Atoi(m[1])
		got[n] = true
	}
	// The last echo may still be on its way when ping is stopped (it
	// prints its summary at once): it is not counted either way.
	if r.Sent > 0 && !got[r.Sent-1] {
		r.Sent--
	}
	run := 0
	for i := 0; i < r.Sent; i++ {
		if got[i] {
			run = 0
			continue
		}
		r.Lost++
		run++
		if gap := time.Duration(run+1) * p.interval; gap > r.LongestGap {
			r.LongestGap = gap
		}
	}
	return r
}

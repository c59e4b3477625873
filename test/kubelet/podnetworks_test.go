package kubelet

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// annotated is a sleeping pod on node asking for networks (none if "").
func annotated(name, node, networks string) string {
	return annotatedIn(name, "default", node, networks)
}

// annotatedIn is annotated in namespace ns.
func annotatedIn(name, ns, node, networks string) string {
	ann := ""
	if networks != "" {
		ann = fmt.Sprintf("  annotations:\n    skein.dev/networks: %q\n", networks)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
%sspec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: %s
    command: ["sleep", "100000"]
---
`, name, ns, ann, node, BusyboxImage)
}

var inet = regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/`)

// TestKubeletPodNetworks turns pod networks on as an operator does
// (test/kubelet/overlay-podnetworks: skeind's configuration in a
// ConfigMap, the meta-mode conflist) and has pods ask for a second
// network by annotation: containerd passes skein.dev/networks through
// the CRI's pod-annotations capability, not a test's libcni call. Pods
// on two nodes reach each other's second interface; a pod without the
// annotation gets only the default network; deleting a pod removes both
// interfaces' records.
func TestKubeletPodNetworks(t *testing.T) {
	c := Start(t, Options{})
	c.Install(t, c.Root+"/test/kubelet/overlay-podnetworks")
	c.CreatePool(t, "default", "10.244.0.0/24", "fd00:244::/120", 4)
	c.CreatePool(t, "blue", "10.245.0.0/24", "", 4)
	c.CreatePool(t, "red", "10.246.0.0/24", "", 4)
	c.WaitNodesReady(t)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	c.Apply(t, annotated("p1", n1.Name, "pool, blue@net1")+annotated("p2", n2.Name, "pool, blue@net1")+annotated("plain", n1.Name, ""))
	c.Kubectl(t, "wait", "--for=condition=Ready", "pod/p1", "pod/p2", "pod/plain", "--timeout=120s")

	blue := map[string]string{}
	for _, p := range []string{"p1", "p2"} {
		out := c.Kubectl(t, "exec", p, "--", "ip", "-o", "-4", "addr", "show", "dev", "net1")
		m := inet.FindStringSubmatch(out)
		if m == nil || !strings.HasPrefix(m[1], "10.245.0.") {
			t.Fatalf("pod %s: net1 has no address of the blue pool (10.245.0.0/24):\n%s", p, out)
		}
		blue[p] = m[1]
		eth0 := c.Kubectl(t, "exec", p, "--", "ip", "-o", "-4", "addr", "show", "dev", "eth0")
		if m := inet.FindStringSubmatch(eth0); m == nil || !strings.HasPrefix(m[1], "10.244.0.") {
			t.Errorf("pod %s: eth0 has no address of the default pool:\n%s", p, eth0)
		}
	}
	if out, err := c.Env.Kubectl("exec", "plain", "--", "ip", "link", "show", "dev", "net1"); err == nil {
		t.Errorf("a pod without the annotation has net1:\n%s", out)
	}
	waitCond(t, 30*time.Second, "ping p2's blue address from p1", func() (bool, string) {
		out, err := c.Env.Kubectl("exec", "p1", "--", "ping", "-c", "1", "-W", "2", blue["p2"])
		return err == nil && strings.Contains(string(out), " 0% packet loss"), string(out)
	})

	// A tenant writes any annotation: a network its namespace may not use
	// is refused (the sandbox fails with skein's error naming both), the
	// same network works from a namespace its selector admits.
	c.Apply(t, annotatedIn("intruder", "default", n1.Name, "pool, red@net1"))
	waitCond(t, 60*time.Second, "the intruder's sandbox refused", func() (bool, string) {
		out, _ := c.Env.Kubectl("get", "events", "--field-selector", "involvedObject.name=intruder", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(string(out), `pod network "red" may not be used by pods of namespace "default"`), string(out)
	})
	if p := c.Pod(t, "intruder"); len(p.Status.PodIPs) != 0 || p.Status.Phase == "Running" {
		t.Errorf("the intruder runs with %v", p.Status.PodIPs)
	}
	c.Apply(t, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-red\n  labels: {team: red}\n---\n"+
		annotatedIn("member", "team-red", n1.Name, "pool, red@net1"))
	c.Kubectl(t, "-n", "team-red", "wait", "--for=condition=Ready", "pod/member", "--timeout=120s")
	out := c.Kubectl(t, "-n", "team-red", "exec", "member", "--", "ip", "-o", "-4", "addr", "show", "dev", "net1")
	if m := inet.FindStringSubmatch(out); m == nil || !strings.HasPrefix(m[1], "10.246.0.") {
		t.Errorf("team-red's pod has no address of the red pool on net1:\n%s", out)
	}
	c.Kubectl(t, "delete", "pod", "intruder", "--wait=true", "--timeout=60s")

	before := len(c.Attachments(t, n1))
	c.Kubectl(t, "delete", "pod", "p1", "--wait=true", "--timeout=60s")
	waitCond(t, 60*time.Second, n1.Name+": p1's records gone", func() (bool, string) {
		recs := c.Attachments(t, n1)
		for _, r := range recs {
			if strings.Contains(fmt.Sprint(r), blue["p1"]) {
				return false, fmt.Sprint(recs)
			}
		}
		return len(recs) < before, fmt.Sprintf("%d records, %d before: %v", len(recs), before, recs)
	})
}

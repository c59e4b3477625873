package kubelet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// web is a Deployment of busybox httpd pods spread over the nodes (each
// answers with its own name) behind a ClusterIP and NodePort Service.
const web = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 4
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        labelSelector:
          matchLabels: {app: web}
      containers:
      - name: web
        image: ` + BusyboxImage + `
        command: ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]
        ports:
        - containerPort: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - port: 80
    targetPort: 8080
`

// TestKubeletNode installs skein as an operator does (kubectl apply -k)
// on a cluster of two real nodes — kubelet, containerd and kube-proxy
// each — and runs pods on it: addresses from the namespace's pool in
// both families, pods on two nodes reaching each other, a ClusterIP and a
// NodePort Service through kube-proxy in iptables then nftables mode, and
// pod deletion giving the addresses back and leaving no veth.
func TestKubeletNode(t *testing.T) {
	c := Start(t, Options{})
	c.Install(t, filepath.Join(c.Root, "test", "kubelet", "overlay"))
	c.CreatePool(t, "default", "10.244.0.0/24", "fd00:244::/120", 4)
	c.WaitNodesReady(t)

	c.Apply(t, web)
	c.Kubectl(t, "rollout", "status", "deployment/web", "--timeout=180s")
	pods := c.Pods(t, "default", "app=web")
	byNode := map[string][]corev1.Pod{}
	seen := map[netip.Addr]string{}
	for _, p := range pods {
		addrs := PodAddrs(&p)
		if len(addrs) != 2 || !addrs[0].Is4() || !addrs[1].Is6() {
			t.Fatalf("pod %s has addresses %v, want one IPv4 and one IPv6", p.Name, addrs)
		}
		for _, a := range addrs {
			if !netip.MustParsePrefix("10.244.0.0/24").Contains(a) && !netip.MustParsePrefix("fd00:244::/120").Contains(a) {
				t.Errorf("pod %s: %v is outside the pool", p.Name, a)
			}
			if other, dup := seen[a]; dup {
				t.Errorf("%v is on pods %s and %s", a, other, p.Name)
			}
			seen[a] = p.Name
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
	}
	if len(byNode) != 2 {
		t.Fatalf("web's pods are on %d nodes, want 2", len(byNode))
	}
	a, b := byNode[c.Nodes[0].Name][0], byNode[c.Nodes[1].Name][0]
	for _, dst := range PodAddrs(&b) {
		out := c.Kubectl(t, "exec", a.Name, "--", "ping", "-c", "2", "-W", "3", dst.String())
		if !strings.Contains(out, " 0% packet loss") {
			t.Errorf("ping %s (%s on %s) from %s on %s:\n%s", dst, b.Name, b.Spec.NodeName, a.Name, a.Spec.NodeName, out)
		}
	}

	for _, mode := range []string{"iptables", "nftables"} {
		if mode != c.proxyMode {
			c.SetProxyMode(t, mode)
		}
		c.checkService(t, a, pods, mode)
	}

	// Deleting the pods gives their addresses back: skeind's records on
	// each node go to 0 and no pod veth stays.
	c.Kubectl(t, "scale", "deployment/web", "--replicas=0")
	c.Kubectl(t, "wait", "--for=delete", "pod", "-l", "app=web", "--timeout=120s")
	for _, n := range c.Nodes {
		waitCond(t, 60*time.Second, fmt.Sprintf("%s: skeind's records of deleted pods gone", n.Name), func() (bool, string) {
			recs := c.Attachments(t, n)
			return len(recs) == 0, fmt.Sprint(recs)
		})
		out, err := n.Command("ip", "-o", "link", "show", "type", "veth").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: ip link: %v\n%s", n.Name, err, out)
		}
		var left []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// eth0 is the node's uplink to the bridge (a veth too).
			if l != "" && !strings.Contains(l, " eth0@") {
				left = append(left, l)
			}
		}
		if len(left) > 0 {
			t.Errorf("%s: veths left after every pod was deleted:\n%s", n.Name, strings.Join(left, "\n"))
		}
	}
}

// checkService reads the web Service through its ClusterIP from pod a and
// through its NodePort from each node's namespace: every answer must be a
// web pod's name.
func (c *Cluster) checkService(t *testing.T, a corev1.Pod, pods []corev1.Pod, mode string) {
	t.Helper()
	var svc corev1.Service
	if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "web"}, &svc); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
	}
	waitCond(t, 60*time.Second, fmt.Sprintf("kube-proxy %s: ClusterIP %s from pod %s", mode, svc.Spec.ClusterIP, a.Name), func() (bool, string) {
		// busybox's nc: Debian's static busybox wget crashes (SIGSEGV).
		out, err := c.Env.Kubectl("exec", a.Name, "--", "sh", "-c",
			`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$0" 80`, svc.Spec.ClusterIP)
		got := lastLine(string(out))
		return err == nil && names[got], string(out)
	})
	port := svc.Spec.Ports[0].NodePort
	for _, n := range c.Nodes {
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(n.IPv4, fmt.Sprint(port)))
		waitCond(t, 60*time.Second, fmt.Sprintf("kube-proxy %s: NodePort %s from %s", mode, url, n.Name), func() (bool, string) {
			got, err := n.HTTPGet(url)
			if err != nil {
				return false, err.Error()
			}
			return names[strings.TrimSpace(got)], got
		})
	}
}

// waitCond polls ok every half second until it holds or timeout passes,
// then fails the test with what ok last said.
func waitCond(t testing.TB, timeout time.Duration, what string, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, last := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v (last: %s)", what, timeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// lastLine is the last non-empty line of s, trimmed.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

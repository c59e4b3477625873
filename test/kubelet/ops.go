package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/kube"
)

// Apply applies manifests (YAML) as the admin.
func (c *Cluster) Apply(t testing.TB, manifests string) {
	t.Helper()
	f, err := os.CreateTemp(c.Dir, "apply-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(manifests); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c.Kubectl(t, "apply", "-f", f.Name())
}

// WaitNodesReady waits until every Node reports Ready (its runtime's
// network is ready once skeind's installer wrote the conflist).
func (c *Cluster) WaitNodesReady(t testing.TB) {
	t.Helper()
	for _, n := range c.Nodes {
		err := waitFor(120*time.Second, n.kubelet, func() bool {
			var node corev1.Node
			if c.Client.Get(context.Background(), client.ObjectKey{Name: n.Name}, &node) != nil {
				return false
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					return cond.Status == corev1.ConditionTrue
				}
			}
			return false
		})
		if err != nil {
			t.Fatalf("%s not Ready: %v\n%s", n.Name, err, n.kubelet.Tail(30))
		}
	}
}

// Pods lists the pods of namespace matching selector ("k=v").
func (c *Cluster) Pods(t testing.TB, namespace, selector string) []corev1.Pod {
	t.Helper()
	k, v, _ := strings.Cut(selector, "=")
	var list corev1.PodList
	if err := c.Client.List(context.Background(), &list, client.InNamespace(namespace), client.MatchingLabels{k: v}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// SetProxyMode restarts every node's kube-proxy in mode, after removing
// the rules of the one before (kube-proxy --cleanup), as an operator who
// switches modes does.
func (c *Cluster) SetProxyMode(t testing.TB, mode string) {
	t.Helper()
	kc, err := c.Env.WriteKubeconfig("system:kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		n.proxy.Stop(10 * time.Second)
		n.proxy = nil
		cfg := filepath.Join(n.Dir, "etc", "kube-proxy.yaml")
		out, err := n.Command(filepath.Join(kube.AssetsDir(), "kube-proxy"), "--config="+cfg, "--cleanup").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: kube-proxy --cleanup: %v\n%s", n.Name, err, out)
		}
		n.startProxy(t, kc, mode, PodCIDRs)
	}
	c.proxyMode = mode
}

// SkeindPod returns the name of the skeind pod on node n.
func (c *Cluster) SkeindPod(t testing.TB, n *Node) string {
	t.Helper()
	var list corev1.PodList
	if err := c.Client.List(context.Background(), &list, client.InNamespace("skein-system"),
		client.MatchingLabels{"app.kubernetes.io/name": "skeind"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.Spec.NodeName == n.Name && p.DeletionTimestamp == nil {
			return p.Name
		}
	}
	t.Fatalf("no skeind pod on %s", n.Name)
	return ""
}

// Attachments returns skeind's attachment records on node n (skeinctl
// attachment list, in the skeind pod).
func (c *Cluster) Attachments(t testing.TB, n *Node) []map[string]any {
	t.Helper()
	out, err := c.Env.Kubectl("-n", "skein-system", "exec", c.SkeindPod(t, n), "-c", "skeind", "--", "skeinctl", "attachment", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	if err := json.Unmarshal(out, &recs); err != nil {
		t.Fatalf("skeinctl attachment list on %s: %v\n%s", n.Name, err, out)
	}
	return recs
}

// HTTPGet fetches url from the node's network namespace.
func (n *Node) HTTPGet(url string) (string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := netns.Do(n.NS.Path(), func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), err
}

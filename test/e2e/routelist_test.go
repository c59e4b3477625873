package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

// routeListRow is one element of `skeinctl route list -o json`.
type routeListRow struct {
	Block         string   `json:"block"`
	Name          string   `json:"name"`
	Node          string   `json:"node"`
	NodeAddresses []string `json:"nodeAddresses"`
	Mode          string   `json:"mode"`
	Via           string   `json:"via"`
	Installed     bool     `json:"installed"`
	Reason        string   `json:"reason"`
}

func (n *kubeNode) routeList(t *testing.T) []routeListRow {
	t.Helper()
	out, err := exec.Command(filepath.Join(n.d.BinDir, "skeinctl"), "--socket", n.d.Socket, "-o", "json", "route", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("skeinctl route list: %v\n%s", err, out)
	}
	var rows []routeListRow
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("skeinctl route list -o json: %v\n%s", err, out)
	}
	return rows
}

// metric returns the sum of the samples of name whose labels contain
// labels ("" = all).
func (n *kubeNode) routeMetric(t *testing.T, name, labels string) float64 {
	t.Helper()
	resp, err := http.Get(n.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") || !strings.Contains(line, labels) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		total += v
	}
	return total
}

// TestRouteList runs a real skeind --store kubernetes --routing direct
// against a real API server: it publishes --node-address on its Node,
// lists every other node's blocks (one row per family) with the node's
// address from the annotation or the InternalIP, follows a new block
// within a second, counts its syncs, reports an unroutable node with a
// Warning event on that Node; and bad routing settings stop it at start
// with a clear error.
func TestRouteList(t *testing.T) {
	harness.RequireRoot(t)
	kenv := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(kenv.Config)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	for _, n := range []struct{ name, internal string }{{"rl-1", "10.250.0.1"}, {"rl-2", "10.250.0.2"}, {"rl-3", ""}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		if err := c.Create(bg, node); err != nil {
			t.Fatal(err)
		}
		if n.internal != "" {
			node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.internal}}
			if err := c.Status().Update(bg, node); err != nil {
				t.Fatal(err)
			}
		}
	}
	block := func(index int64, node, v4, v6 string) {
		t.Helper()
		b := &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("rl", uint32(index)),
			Labels: map[string]string{skeinv1.LabelPool: "rl", skeinv1.LabelNode: node}}, Index: index, IPv4: ptr.To(v4)}
		if v6 != "" {
			b.IPv6 = ptr.To(v6)
		}
		if err := c.Create(bg, b); err != nil {
			t.Fatal(err)
		}
	}
	block(0, "rl-1", "10.96.0.0/27", "")
	block(1, "rl-2", "10.96.0.32/27", "fd96::20/123")
	block(2, "rl-3", "10.96.0.64/27", "")
	kc, err := kenv.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}

	// Bad settings: a clear error at start, the Node untouched.
	bin := filepath.Join(skeintest.Binaries(t), "skeind")
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--routing", "direct"}, "--routing direct needs --store kubernetes"},
		{[]string{"--store", "kubernetes", "--kubeconfig", kc, "--node", "rl-1", "--routing", "mesh"}, `routing mode "mesh"`},
		{[]string{"--store", "kubernetes", "--kubeconfig", kc, "--node", "rl-1", "--routing", "direct", "--node-address", "10.0.0.1,10.0.0.2"}, "more than one address of a family"},
		{[]string{"--store", "kubernetes", "--kubeconfig", kc, "--node", "rl-3", "--routing", "vxlan"}, "--routing vxlan needs this node's underlay address"},
	} {
		dir := t.TempDir()
		cmd := exec.Command(bin, append([]string{"--state-dir", dir + "/state", "--socket", dir + "/s.sock", "--metrics-addr", "off", "--docker-socket", "off"}, bad.args...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), bad.want) {
			t.Errorf("skeind %s: %v\n%s\nwant an error containing %q", strings.Join(bad.args, " "), err, out, bad.want)
		}
	}
	n1 := &corev1.Node{}
	if err := c.Get(bg, client.ObjectKey{Name: "rl-1"}, n1); err != nil {
		t.Fatal(err)
	}
	if _, ok := n1.Annotations[skeinv1.AnnotationNodeAddress]; ok {
		t.Errorf("a refused skeind annotated its Node: %v", n1.Annotations)
	}

	// rl-2 says its address by annotation.
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"skein.dev/node-address":"192.0.2.2,2001:db8::2"}}}`))
	if err := c.Patch(bg, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rl-2"}}, patch); err != nil {
		t.Fatal(err)
	}
	n := startKubeNode(t, kc, "rl-1", "--routing", "direct", "--node-address", "192.0.2.1")
	if err := c.Get(bg, client.ObjectKey{Name: "rl-1"}, n1); err != nil {
		t.Fatal(err)
	}
	if got := n1.Annotations[skeinv1.AnnotationNodeAddress]; got != "192.0.2.1" {
		t.Errorf("Node rl-1's %s = %q, want skeind's --node-address 192.0.2.1", skeinv1.AnnotationNodeAddress, got)
	}

	want := []routeListRow{
		{Block: "10.96.0.32/27", Name: "rl-1", Node: "rl-2", NodeAddresses: []string{"192.0.2.2", "2001:db8::2"}, Mode: "direct"},
		{Block: "10.96.0.64/27", Name: "rl-2", Node: "rl-3", Mode: "direct"},
		{Block: "fd96::20/123", Name: "rl-1", Node: "rl-2", NodeAddresses: []string{"192.0.2.2", "2001:db8::2"}, Mode: "direct"},
	}
	var rows []routeListRow
	routeListWait(t, 10*time.Second, "the first sync", func() bool { rows = n.routeList(t); return len(rows) == len(want) })
	for i, w := range want {
		r := rows[i]
		// Nothing in the node namespace reaches these addresses: not
		// installed, with a reason.
		if r.Block != w.Block || r.Node != w.Node || !slices.Equal(r.NodeAddresses, w.NodeAddresses) || r.Mode != w.Mode || r.Installed || r.Reason == "" {
			t.Errorf("route %d: %+v, want %+v, not installed, with a reason", i, r, w)
		}
	}

	// A new block of rl-2 is listed within a second.
	start := time.Now()
	block(3, "rl-2", "10.96.0.96/27", "")
	routeListWait(t, 5*time.Second, "the new block", func() bool {
		return slices.ContainsFunc(n.routeList(t), func(r routeListRow) bool { return r.Block == "10.96.0.96/27" })
	})
	if took := time.Since(start); took > time.Second {
		t.Errorf("a new block took %v to be listed, want < 1s", took)
	}
	if v := n.routeMetric(t, "skein_route_syncs_total", `result="ok"`); v < 2 {
		t.Errorf("skein_route_syncs_total{result=ok} = %v, want ≥ 2", v)
	}
	if v := n.routeMetric(t, "skein_route_remote_blocks", `state="missing"`); v != 4 {
		t.Errorf("skein_route_remote_blocks{state=missing} = %v, want 4", v)
	}
	if v := n.routeMetric(t, "skein_route_unreachable_nodes", ""); v != 2 {
		t.Errorf("skein_route_unreachable_nodes = %v, want 2", v)
	}
	routeListWait(t, 10*time.Second, "a NodeUnreachable event on rl-3", func() bool {
		var list corev1.EventList
		if err := c.List(bg, &list, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(list.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "rl-3" && e.Reason == "NodeUnreachable" && e.Source.Host == "rl-1"
		})
	})
}

func routeListWait(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

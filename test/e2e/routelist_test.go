package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
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
	// The pool the blocks are slices of: a block is routed only where its
	// slices are the ones its pool and index give it.
	if err := c.Create(bg, &skeinv1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "rl"}, Spec: skeinv1.AddressPoolSpec{
		Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.96.0.0/24"), IPv6: ptr.To("fd96::/120")}}, BlockSizeBits: 5}}); err != nil {
		t.Fatal(err)
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
	// Typically well under a second; the assertion is routeListWait's
	// bound, which leaves room for a loaded machine.
	t.Logf("a new block was listed after %v", time.Since(start))
	if v := n.routeMetric(t, "skein_route_syncs_total", `result="ok"`); v < 2 {
		t.Errorf("skein_route_syncs_total{result=ok} = %v, want ≥ 2", v)
	}
	// The listing can show the block a moment before the gauges are
	// updated (the loop sets the statuses, then reports).
	routeListWait(t, 5*time.Second, "skein_route_remote_blocks{state=missing} = 4", func() bool {
		return n.routeMetric(t, "skein_route_remote_blocks", `state="missing"`) == 4
	})
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

// TestRouteModesOneNode runs real skeind binaries one after the other on
// one node namespace with an underlay link (192.0.2.1/24, 2001:db8::1/64)
// against a real API server: direct installs routes via a peer on that
// link into table 120 and reports the node without an address; vxlan
// makes the device with the underlay MTU minus 50 and lowers the pod MTU
// to it; export, on the embedded store and on the Kubernetes store,
// removes what the other modes left.
func TestRouteModesOneNode(t *testing.T) {
	harness.RequireRoot(t)
	kenv := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(kenv.Config)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	for _, n := range []struct{ name, ann string }{{"rm-1", ""}, {"rm-2", "192.0.2.2,2001:db8::2"}, {"rm-3", ""}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		if n.ann != "" {
			node.Annotations = map[string]string{skeinv1.AnnotationNodeAddress: n.ann}
		}
		if err := c.Create(bg, node); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Create(bg, &skeinv1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: "rm"}, Spec: skeinv1.AddressPoolSpec{
		Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.97.0.0/24"), IPv6: ptr.To("fd97::/120")}}, BlockSizeBits: 5}}); err != nil {
		t.Fatal(err)
	}
	for i, b := range []struct{ node, v4, v6 string }{
		{"rm-2", "10.97.0.0/27", "fd97::/123"},
		{"rm-3", "10.97.0.32/27", ""},
	} {
		blk := &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("rm", uint32(i)),
			Labels: map[string]string{skeinv1.LabelPool: "rm", skeinv1.LabelNode: b.node}}, Index: int64(i), IPv4: ptr.To(b.v4)}
		if b.v6 != "" {
			blk.IPv6 = ptr.To(b.v6)
		}
		if err := c.Create(bg, blk); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := kenv.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	ns := harness.NewNS(t, "node")
	for _, args := range [][]string{
		{"ip", "link", "add", "ul0", "mtu", "1500", "type", "veth", "peer", "name", "ul1"},
		{"ip", "link", "set", "ul1", "up"},
		{"ip", "addr", "add", "192.0.2.1/24", "dev", "ul0"},
		{"ip", "addr", "add", "2001:db8::1/64", "dev", "ul0", "nodad"},
		{"ip", "link", "set", "ul0", "up"},
	} {
		if out, err := ns.Exec(t, args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	ip := func(args ...string) string {
		t.Helper()
		out, err := ns.Exec(t, "ip", args...)
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return out
	}
	start := func(args ...string) *kubeNode {
		t.Helper()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		args = append([]string{"--store", "kubernetes", "--kubeconfig", kc, "--node", "rm-1", "--metrics-addr", addr}, args...)
		e := newEnv(t, skeintest.Options{Node: ns, DefaultPool: []string{}, Args: args})
		return &kubeNode{env: e, name: "rm-1", metrics: "http://" + addr + "/metrics"}
	}

	// direct
	n := start("--routing", "direct", "--node-address", "192.0.2.1")
	var rows []routeListRow
	routeListWait(t, 10*time.Second, "direct routes", func() bool {
		rows = n.routeList(t)
		return len(rows) == 3 && rows[0].Installed
	})
	t.Logf("direct: %+v", rows)
	wantRows := []routeListRow{
		{Block: "10.97.0.0/27", Node: "rm-2", Via: "192.0.2.2", Installed: true},
		{Block: "10.97.0.32/27", Node: "rm-3"},
		{Block: "fd97::/123", Node: "rm-2", Via: "2001:db8::2", Installed: true},
	}
	for i, w := range wantRows {
		r := rows[i]
		if r.Block != w.Block || r.Node != w.Node || r.Via != w.Via || r.Installed != w.Installed || r.Mode != "direct" || (r.Reason == "") == !w.Installed {
			t.Errorf("direct route %d: %+v, want %+v", i, r, w)
		}
	}
	for _, want := range []string{"10.97.0.0/27 via 192.0.2.2 dev ul0 proto 32"} {
		if got := ip("-4", "route", "show", "table", "120"); !strings.Contains(got, want) {
			t.Errorf("table 120 (IPv4):\n%s\nwant %q", got, want)
		}
	}
	if got := ip("-6", "route", "show", "table", "120"); !strings.Contains(got, "fd97::/123 via 2001:db8::2 dev ul0 proto 32") {
		t.Errorf("table 120 (IPv6):\n%s", got)
	}
	n.d.Stop(t)

	// vxlan, the device's MTU from the underlay's
	n = start("--routing", "vxlan", "--node-address", "192.0.2.1", "--vxlan-vni", "4242")
	routeListWait(t, 10*time.Second, "vxlan routes", func() bool {
		rows = n.routeList(t)
		return len(rows) == 3 && rows[0].Installed && rows[0].Mode == "vxlan"
	})
	t.Logf("vxlan: %+v", rows)
	if dev := ip("-d", "link", "show", "skein.vxlan"); !strings.Contains(dev, "mtu 1450") || !strings.Contains(dev, "vxlan id 4242") {
		t.Errorf("skein.vxlan:\n%s\nwant mtu 1450 (1500 - 50), id 4242", dev)
	}
	if !strings.Contains(n.d.Log(), "mtu=1450") {
		t.Errorf("skeind did not lower the pod MTU to 1450:\n%s", n.d.Log())
	}
	if got := ip("-4", "route", "show", "table", "120"); !strings.Contains(got, "10.97.0.0/27 via 10.97.0.0 dev skein.vxlan proto 32 onlink") {
		t.Errorf("table 120 in vxlan mode:\n%s", got)
	}
	n.d.Stop(t)

	// export on the embedded store removes it all at start.
	skeintest.StartDaemon(t, skeintest.Options{Node: ns, DefaultPool: []string{}}).Stop(t)
	if got := ip("route", "show", "table", "120") + ip("-6", "route", "show", "table", "120"); strings.TrimSpace(got) != "" {
		t.Errorf("table 120 after skeind --routing export:\n%s", got)
	}
	if out, err := ns.Exec(t, "ip", "link", "show", "skein.vxlan"); err == nil {
		t.Errorf("skein.vxlan still there after skeind --routing export:\n%s", out)
	}
	if got := ip("rule", "show"); strings.Contains(got, "lookup 120") {
		t.Errorf("the rule of table 120 is still there after skeind --routing export:\n%s", got)
	}

	// export on the Kubernetes store: direct's leftovers go; the list says
	// no routing daemon installed the blocks.
	start("--routing", "direct", "--node-address", "192.0.2.1").d.Stop(t)
	if got := ip("route", "show", "table", "120"); !strings.Contains(got, "10.97.0.0/27") {
		t.Fatalf("direct mode left no route to remove:\n%s", got)
	}
	n = start()
	routeListWait(t, 10*time.Second, "export statuses", func() bool {
		rows = n.routeList(t)
		return len(rows) == 3 && rows[0].Mode == "export"
	})
	for _, r := range rows {
		if r.Installed || !strings.Contains(r.Reason, "routing daemon") {
			t.Errorf("export mode with no routing daemon: %+v", r)
		}
	}
	if got := ip("route", "show", "table", "120"); strings.TrimSpace(got) != "" {
		t.Errorf("table 120 after skeind --routing export (kubernetes store):\n%s", got)
	}
}

package routing

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

func TestParseNodeAddresses(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string // joined addresses, or the error's substring after "!"
	}{
		{"192.0.2.1", "192.0.2.1"},
		{"192.0.2.1,2001:db8::1", "192.0.2.1 2001:db8::1"},
		{" 2001:db8::1 , 192.0.2.1 ", "2001:db8::1 192.0.2.1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"", "!empty"},
		{"192.0.2.1,192.0.2.2", "!more than one address of a family"},
		{"2001:db8::1,2001:db8::2", "!more than one address of a family"},
		{"192.0.2.1,", "!node address \"\""},
		{"10.0.0.0/8", "!node address \"10.0.0.0/8\""},
		{"127.0.0.1", "!not a unicast address"},
		{"0.0.0.0", "!not a unicast address"},
		{"ff02::1", "!not a unicast address"},
		{"fe80::1", "!not a unicast address"},
		{"fe80::1%eth0", "!zone"},
	} {
		got, err := ParseNodeAddresses(tt.in)
		if strings.HasPrefix(tt.want, "!") {
			if err == nil || !strings.Contains(err.Error(), tt.want[1:]) {
				t.Errorf("ParseNodeAddresses(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.want[1:])
			}
			continue
		}
		if err != nil || joinAddrs(got) != tt.want {
			t.Errorf("ParseNodeAddresses(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func joinAddrs(as []netip.Addr) string {
	var s []string
	for _, a := range as {
		s = append(s, a.String())
	}
	return strings.Join(s, " ")
}

func TestNodeAddresses(t *testing.T) {
	node := func(ann string, addrs ...corev1.NodeAddress) *corev1.Node {
		n := &corev1.Node{Status: corev1.NodeStatus{Addresses: addrs}}
		if ann != "" {
			n.Annotations = map[string]string{skeinv1.AnnotationNodeAddress: ann}
		}
		return n
	}
	ip := func(typ corev1.NodeAddressType, a string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: typ, Address: a}
	}
	for _, tt := range []struct {
		name string
		n    *corev1.Node
		want string
		bad  bool
	}{
		{"internal IPs, first per family", node("", ip(corev1.NodeExternalIP, "203.0.113.1"), ip(corev1.NodeInternalIP, "10.0.0.1"),
			ip(corev1.NodeInternalIP, "10.0.0.2"), ip(corev1.NodeInternalIP, "fd00::1"), ip(corev1.NodeHostName, "n1")), "10.0.0.1 fd00::1", false},
		{"annotation wins", node("192.0.2.7", ip(corev1.NodeInternalIP, "10.0.0.1")), "192.0.2.7", false},
		{"bad annotation: internal IPs", node("192.0.2.7,192.0.2.8", ip(corev1.NodeInternalIP, "10.0.0.1")), "10.0.0.1", true},
		{"nothing", node(""), "", false},
		// InternalIPs are checked as the annotation is: the first one a
		// peer can send to (a multicast one would have every node
		// multicast this node's pod traffic on the underlay).
		{"internal IPs other nodes cannot reach", node("", ip(corev1.NodeInternalIP, "224.0.0.9"), ip(corev1.NodeInternalIP, "127.0.0.1"),
			ip(corev1.NodeInternalIP, "169.254.1.1"), ip(corev1.NodeInternalIP, "0.0.0.0"), ip(corev1.NodeInternalIP, "255.255.255.255"),
			ip(corev1.NodeInternalIP, "ff02::1"), ip(corev1.NodeInternalIP, "fe80::1"), ip(corev1.NodeInternalIP, "10.0.0.3")), "10.0.0.3", false},
	} {
		got, bad := NodeAddresses(tt.n)
		if joinAddrs(got) != tt.want || (bad != nil) != tt.bad {
			t.Errorf("%s: %v, %v; want %s (bad annotation: %v)", tt.name, got, bad, tt.want, tt.bad)
		}
	}
}

// TestWatcher runs the watcher against a real API server: every node's
// blocks but this node's, node addresses from annotation or InternalIPs,
// a change signal for blocks and addresses and none for a heartbeat, and
// events recorded on the Node.
func TestWatcher(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mkNode := func(name, ann string, internal ...string) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if ann != "" {
			n.Annotations = map[string]string{skeinv1.AnnotationNodeAddress: ann}
		}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		for _, a := range internal {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		if err := c.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// mkBlock makes a block of the old protocol (the label only);
	// mkOwned one with nodeName too (label "": none).
	mkOwned := func(pool string, index int64, nodeName, label string, v4, v6 string) *skeinv1.AddressBlock {
		t.Helper()
		b := &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName(pool, uint32(index)),
			Labels: map[string]string{skeinv1.LabelPool: pool}}, Index: index, NodeName: nodeName}
		if label != "" {
			b.Labels[skeinv1.LabelNode] = label
		}
		if v4 != "" {
			b.IPv4 = ptr.To(v4)
		}
		if v6 != "" {
			b.IPv6 = ptr.To(v6)
		}
		if err := c.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	mkBlock := func(pool string, index int64, node string, v4, v6 string) *skeinv1.AddressBlock {
		t.Helper()
		return mkOwned(pool, index, "", node, v4, v6)
	}
	// The pools decide the blocks' slices: a block is routed only where
	// its ipv4 and ipv6 are the ones its pool and index give it.
	mkPool := func(name string, sets ...skeinv1.SubnetSet) {
		t.Helper()
		p := &skeinv1.AddressPool{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: skeinv1.AddressPoolSpec{Subnets: sets, BlockSizeBits: 5}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	mkPool("p", skeinv1.SubnetSet{IPv4: ptr.To("10.64.0.0/24"), IPv6: ptr.To("fd64::/120")})
	mkPool("q", skeinv1.SubnetSet{IPv4: ptr.To("10.65.0.0/24")})
	mkNode("w1", "", "10.0.0.1")
	mkNode("w2", "", "10.0.0.2", "fd00::2")
	mkNode("w3", "192.0.2.3", "10.0.0.3")
	mkNode("w4", "not-an-address", "10.0.0.4")
	mkBlock("p", 0, "w1", "10.64.0.0/27", "fd64::/123")
	mkBlock("p", 1, "w2", "10.64.0.32/27", "fd64::20/123")
	mkBlock("p", 2, "w3", "10.64.0.64/27", "")
	mkBlock("p", 3, "w4", "10.64.0.96/27", "")
	mkBlock("p", 4, "gone", "10.64.0.128/27", "")
	// Owned blocks: routed to their nodeName, label or not; this
	// node's own left out; one whose label disagrees not routed at all.
	mkOwned("q", 0, "w2", "w2", "10.65.0.0/27", "")
	mkOwned("q", 1, "w3", "", "10.65.0.32/27", "")
	mkOwned("q", 2, "w1", "w1", "10.65.0.64/27", "")
	mkOwned("q", 3, "w3", "w2", "10.65.0.96/27", "")
	// Slices that are not the block's: another block's, outside its
	// pool's index range, a family the pool lacks, a pool that does not
	// exist. None is routed.
	mkOwned("q", 4, "w2", "", "10.65.0.0/27", "")
	mkOwned("q", 9, "w2", "", "10.65.1.32/27", "")
	mkOwned("q", 5, "w2", "", "10.65.0.160/27", "fd65::a0/123")
	mkOwned("r", 0, "w2", "", "10.66.0.0/27", "")
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	refusals := func() int {
		logMu.Lock()
		defer logMu.Unlock()
		return strings.Count(logs.String(), "AddressBlock not routed")
	}

	w, err := NewWatcher(ctx, WatchOptions{Config: env.Config, Node: "w1", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	snap, err := w.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"10.64.0.32/27 p-1 w2 [10.0.0.2 fd00::2]",
		"10.64.0.64/27 p-2 w3 [192.0.2.3]",
		"10.64.0.96/27 p-3 w4 [10.0.0.4]",
		"10.64.0.128/27 p-4 gone []",
		"10.65.0.0/27 q-0 w2 [10.0.0.2 fd00::2]",
		"10.65.0.32/27 q-1 w3 [192.0.2.3]",
		"fd64::20/123 p-1 w2 [10.0.0.2 fd00::2]",
	}
	if got := remotesString(snap.Remotes); !slices.Equal(got, want) {
		t.Errorf("remotes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := w.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if n := refusals(); n != 5 || !strings.Contains(logs.String(), "block=q-3") {
		t.Errorf("%d refusals logged after two snapshots, want 5 (q-3, q-4, q-5, q-9, r-0):\n%s", n, logs.String())
	}
	for _, want := range []string{
		`its ipv4 10.65.0.0/27 is not block 4 of pool \"q\" (10.65.0.128/27)" block=q-4`,
		`its index 9 is outside pool \"q\" (8 blocks)" block=q-9`,
		`its ipv6 fd65::a0/123 is not block 5 of pool \"q\" (invalid Prefix)" block=q-5`,
		`its pool \"r\" is unknown`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no refusal %s in the log:\n%s", want, logs.String())
		}
	}
	if bad := snap.Nodes["w4"].BadAnnotation; bad == nil || !strings.Contains(bad.Error(), "not-an-address") {
		t.Errorf("w4's bad annotation: %v", bad)
	}
	if snap.Nodes["w3"].BadAnnotation != nil || snap.Nodes["w2"].UID == "" {
		t.Errorf("nodes: %+v", snap.Nodes)
	}
	if self, ok := w.Self(ctx); !ok || joinAddrs(self.Addrs) != "10.0.0.1" {
		t.Errorf("Self = %+v, %v", self, ok)
	}
	drain(w)

	// A heartbeat (a condition's time) is no change; a new block, a
	// deleted one, and a node's new address are.
	n2 := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: "w2"}, n2); err != nil {
		t.Fatal(err)
	}
	n2.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if err := c.Status().Update(ctx, n2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Changed():
		t.Error("a node's heartbeat signalled a change")
	case <-time.After(500 * time.Millisecond):
	}
	for _, step := range []struct {
		name string
		do   func()
		want string // in the remotes after the change
		gone string // not in them
	}{
		{"new block", func() { mkBlock("p", 5, "w3", "10.64.0.160/27", "") }, "10.64.0.160/27 p-5 w3 [192.0.2.3]", ""},
		{"block deleted", func() {
			if err := c.Delete(ctx, &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: "p-4"}}); err != nil {
				t.Fatal(err)
			}
		}, "", "p-4"},
		{"address annotation", func() {
			patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"skein.dev/node-address":"192.0.2.2"}}}`))
			if err := c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w2"}}, patch); err != nil {
				t.Fatal(err)
			}
		}, "10.64.0.32/27 p-1 w2 [192.0.2.2]", "fd00::2"},
		{"own block", func() { mkBlock("p", 6, "w1", "10.64.0.192/27", "") }, "", "p-6"},
		// A node relabelling another node's block draws no route to
		// itself: the block is no longer routed at all.
		{"relabelled block", func() {
			patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"skein.dev/node":"w3"}}}`))
			if err := c.Patch(ctx, &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: "q-0"}}, patch); err != nil {
				t.Fatal(err)
			}
		}, "", "q-0"},
		// An old block adopted by its node (nodeName set) stays its.
		{"adopted block", func() {
			patch := client.RawPatch("application/merge-patch+json", []byte(`{"nodeName":"w3"}`))
			if err := c.Patch(ctx, &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: "p-5"}}, patch); err != nil {
				t.Fatal(err)
			}
		}, "10.64.0.160/27 p-5 w3 [192.0.2.3]", ""},
	} {
		step.do()
		select {
		case <-w.Changed():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no change signalled", step.name)
		}
		// The signal follows the cache's update.
		snap, err := w.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		all := strings.Join(remotesString(snap.Remotes), "\n")
		if step.want != "" && !strings.Contains(all, step.want) || step.gone != "" && strings.Contains(all, step.gone) {
			t.Errorf("%s: remotes\n%s\nwant %q, not %q", step.name, all, step.want, step.gone)
		}
	}

	if n := refusals(); n != 6 || !strings.Contains(logs.String(), "block=q-0") {
		t.Errorf("%d refusals logged, want 6 (q-3, q-4, q-5, q-9 and r-0 once, q-0):\n%s", n, logs.String())
	}

	// Events land on the Node object.
	ev, err := NewNodeEvents(env.Config, "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	ev.NodeWarning(snap.Nodes["w3"], ReasonNodeUnreachable, "1 of 2 blocks of node w3 have no direct route from this node: x")
	deadline := time.Now().Add(10 * time.Second)
	for {
		var list corev1.EventList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		found := slices.ContainsFunc(list.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "w3" && e.Reason == ReasonNodeUnreachable &&
				e.Type == corev1.EventTypeWarning && e.Source.Component == "skeind" && e.Source.Host == "w1"
		})
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no NodeUnreachable event on Node w3: %+v", list.Items)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func drain(w *Watcher) {
	for {
		select {
		case <-w.Changed():
			time.Sleep(100 * time.Millisecond)
		case <-time.After(300 * time.Millisecond):
			return
		}
	}
}

func remotesString(rs []Remote) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Block.String()+" "+r.Name+" "+r.Node+" ["+joinAddrs(r.NodeAddrs)+"]")
	}
	return out
}

// BenchmarkSnapshot3000Blocks: building a Snapshot from a cache's 1,000
// Nodes and 3,000 AddressBlocks (the part of every sync, full or not, that
// reads the cluster).
func BenchmarkSnapshot3000Blocks(b *testing.B) {
	var nodes []corev1.Node
	var blocks []skeinv1.AddressBlock
	for n := 0; n < 1000; n++ {
		name := fmt.Sprintf("node-%d", n)
		nodes = append(nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.100.%d.%d", n>>8, n&255)}}}})
		for i := 0; i < 3; i++ {
			k := n*3 + i
			blocks = append(blocks, skeinv1.AddressBlock{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", k), Labels: map[string]string{skeinv1.LabelNode: name}},
				NodeName:   name, Index: int64(k), IPv4: ptr.To(fmt.Sprintf("10.%d.%d.%d/27", k>>11, (k>>3)&255, (k<<5)&255)),
			})
		}
	}
	pools := []skeinv1.AddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.0.0.0/8")}}, BlockSizeBits: 5}}}
	w := &Watcher{node: "node-0", log: quietLogger(), refused: map[string]string{}}
	b.ReportAllocs()
	for b.Loop() {
		if snap := w.snapshotOf(nodes, blocks, pools); len(snap.Remotes) != 2997 {
			b.Fatalf("%d remotes", len(snap.Remotes))
		}
	}
}

// TestReservedSlicesNotRouted: a block of another node whose slice of a
// family the pool reserves whole (which no honest node claims: a node
// whose own checks are off, or a hostile one, could) routes nothing of
// that family: the reserved range (VIPs, infrastructure) must not be
// drawn to that node. The rest of its blocks route as before.
func TestReservedSlicesNotRouted(t *testing.T) {
	pools := []skeinv1.AddressPool{{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: skeinv1.AddressPoolSpec{Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To("10.64.0.0/26"), IPv6: ptr.To("fd00:64::/122")}},
			BlockSizeBits: 4, Reserved: []string{"10.64.0.16/28", "10.64.0.32-10.64.0.40"}}}}
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "evil"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.9"}}}}}
	var blocks []skeinv1.AddressBlock
	for i, s := range [][2]string{{"10.64.0.16/28", "fd00:64::10/124"}, {"10.64.0.32/28", "fd00:64::20/124"}} {
		blocks = append(blocks, skeinv1.AddressBlock{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i+1), Labels: map[string]string{skeinv1.LabelNode: "evil"}},
			NodeName:   "evil", Index: int64(i + 1), IPv4: ptr.To(s[0]), IPv6: ptr.To(s[1])})
	}
	w := &Watcher{node: "node-0", log: quietLogger(), refused: map[string]string{}}
	var got []string
	for _, r := range w.snapshotOf(nodes, blocks, pools).Remotes {
		got = append(got, r.Name+" "+r.Block.String())
	}
	want := []string{"p-2 10.64.0.32/28", "p-1 fd00:64::10/124", "p-2 fd00:64::20/124"}
	if !slices.Equal(got, want) {
		t.Errorf("routed %q, want %q (not 10.64.0.16/28, reserved whole)", got, want)
	}
}

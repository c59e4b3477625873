package kurma

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/skeinnet/skein/api/rpc"
	skeincni "github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// ifaces returns the result's sandbox interfaces with their addresses.
func ifaces(t testing.TB, r types.Result) map[string][]netip.Prefix {
	t.Helper()
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		t.Fatalf("result: %v", err)
	}
	out := map[string][]netip.Prefix{}
	for _, i := range res.Interfaces {
		if i.Sandbox != "" {
			out[i.Name] = nil
		}
	}
	for _, ip := range res.IPs {
		if ip.Interface == nil {
			t.Errorf("address %s names no interface", ip.Address.String())
			continue
		}
		i := res.Interfaces[*ip.Interface]
		p, _ := netip.ParsePrefix(ip.Address.String())
		out[i.Name] = append(out[i.Name], p)
	}
	return out
}

func v4(ps []netip.Prefix) netip.Addr {
	for _, p := range ps {
		if p.Addr().Is4() {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// TestPodThreeNetworks: through the CNI meta mode (libcni and the real
// skein binary), pod A asks by annotation for a skein pool on eth0, a
// wrapped reference bridge (image from a file) on net1 and a wrapped
// reference macvlan (image from the real registry, by digest) on net2;
// pod B asks by CNI_ARGS for the pool and a second bridge network (image
// over http with its digest). Each pod reaches the peer of each of its
// networks; the result lists every interface; CHECK passes; an unknown
// network fails the ADD with nothing left; GC and DEL detach everything;
// the host's network is unchanged.
func TestPodThreeNetworks(t *testing.T) {
	harness.RequireRoot(t)
	before := harness.HostNet(t)
	bin := skeintest.Binaries(t)
	bridgeImg := packCNI(t, bin, "bridge", "host-local")
	macvlanImg := packCNI(t, bin, "macvlan", "host-local")
	registry := skeintest.StartRegistry(t)
	macvlanRef := pushRegistry(t, registry, "skein/macvlan", macvlanImg)
	bridgeURL := serveHTTP(t, bridgeImg)

	node := harness.NewNS(t, "node")
	uplink(t, node, netip.MustParsePrefix("10.88.0.1/24"))
	d := startSkeind(t, node, []map[string]any{
		poolNet("pool", true),
		bridgeNet("blue", "file://"+bridgeImg.path, "", "kbr-blue", "10.77.0.0/24"),
		macvlanNet("green", macvlanRef, "10.88.0.0/24", "10.88.0.10"),
		bridgeNet("red", bridgeURL, bridgeImg.digest, "kbr-red", "10.79.0.0/24"),
	})
	cni := d.CNI()
	list := metaList(t, d)
	base := d.NodeState(t)

	podA := harness.NewNS(t, "pod")
	podB := harness.NewNS(t, "pod")
	rtA := annotated("pod-a-0001", podA.Path(), "pool, blue@net1, green@net2")
	rtB := skeintest.RT("pod-b-0002", podB.Path(), "eth0")
	rtB.Args = [][2]string{{"IgnoreUnknown", "1"}, {"SKEIN_NETWORKS", "pool,red@net1"}}

	resA, err := cni.AddNetworkList(ctx(t), list, rtA)
	if err != nil {
		t.Fatalf("ADD pod A: %v\n%s", err, d.Log())
	}
	resB, err := cni.AddNetworkList(ctx(t), list, rtB)
	if err != nil {
		t.Fatalf("ADD pod B: %v", err)
	}
	a, b := ifaces(t, resA), ifaces(t, resB)
	t.Logf("pod A: %v\npod B: %v", a, b)
	if got := slices.Sorted(maps.Keys(a)); !slices.Equal(got, []string{"eth0", "net1", "net2"}) {
		t.Fatalf("pod A result interfaces %v, want eth0 net1 net2 (%v)", got, a)
	}
	if got := slices.Sorted(maps.Keys(b)); !slices.Equal(got, []string{"eth0", "net1"}) {
		t.Fatalf("pod B result interfaces %v", got)
	}
	for _, c := range []struct {
		pod    *harness.NS
		ifs    map[string][]netip.Prefix
		ifname string
		subnet string
	}{
		{podA, a, "eth0", "10.64.0.0/16"}, {podA, a, "net1", "10.77.0.0/24"}, {podA, a, "net2", "10.88.0.0/24"},
		{podB, b, "eth0", "10.64.0.0/16"}, {podB, b, "net1", "10.79.0.0/24"},
	} {
		addr := v4(c.ifs[c.ifname])
		if !netip.MustParsePrefix(c.subnet).Contains(addr) {
			t.Errorf("%s %s: address %v not in %s", c.pod.Name(), c.ifname, addr, c.subnet)
		}
		h := c.pod.Handle(t)
		l, err := h.LinkByName(c.ifname)
		if err != nil {
			t.Errorf("%s has no %s: %v", c.pod.Name(), c.ifname, err)
			continue
		}
		if addrs, _ := h.AddrList(l, 2); !slices.ContainsFunc(addrs, func(x netlink.Addr) bool { return x.IP.String() == addr.String() }) {
			t.Errorf("%s %s lacks %v", c.pod.Name(), c.ifname, addr)
		}
	}

	// Each network reaches what it should: the other pod on the pool,
	// the bridge's gateway, the macvlan's peer on the uplink.
	for _, p := range []struct {
		from *harness.NS
		to   netip.Addr
		what string
	}{
		{podA, v4(b["eth0"]), "pod B over the pool"},
		{podB, v4(a["eth0"]), "pod A over the pool"},
		{podA, netip.MustParseAddr("10.77.0.1"), "bridge blue's gateway"},
		{podA, netip.MustParseAddr("10.88.0.1"), "the macvlan peer"},
		{podB, netip.MustParseAddr("10.79.0.1"), "bridge red's gateway"},
	} {
		if err := harness.Ping(t, p.from, p.to); err != nil {
			t.Errorf("%s → %s (%s): %v", p.from.Name(), p.to, p.what, err)
		}
	}
	for _, br := range []string{"kbr-blue", "kbr-red"} {
		if _, err := node.Handle(t).LinkByName(br); err != nil {
			t.Errorf("bridge %s not in the node namespace: %v", br, err)
		}
	}

	if err := cni.CheckNetworkList(ctx(t), list, rtA); err != nil {
		t.Errorf("CHECK pod A: %v", err)
	}
	st, err := pods(t, d).Status(ctx(t), &rpc.PodRef{Id: "pod-a-0001"})
	if err != nil || len(st.Attachments) != 3 {
		t.Errorf("pod A status: %v %v", st, err)
	}
	// The Pods API answers alike in skeind's framed protocol and over
	// gRPC, errors included.
	if g, err := podsGRPC(t, d).Status(ctx(t), &rpc.PodRef{Id: "pod-a-0001"}); err != nil || !proto.Equal(g, st) {
		t.Errorf("pod A status over gRPC: %v %v, framed: %v", g, err, st)
	}
	bad := &rpc.PodAttachRequest{Id: "pod-x-0009", Netns: podA.Path(), Networks: []*rpc.PodNetwork{{Network: "nosuch", Ifname: "net5"}}}
	_, errW := pods(t, d).Attach(ctx(t), bad)
	_, errG := podsGRPC(t, d).Attach(ctx(t), bad)
	if sw, sg := status.Convert(errW), status.Convert(errG); errW == nil || sw.Code() != sg.Code() || sw.Message() != sg.Message() || !strings.Contains(sw.Message(), "nosuch") {
		t.Errorf("an unknown network: framed %v, gRPC %v: want the same error naming it", errW, errG)
	}

	// An unknown network: a clear error, nothing attached.
	podC := harness.NewNS(t, "pod")
	snapC := harness.Snapshot(t, podC)
	_, err = cni.AddNetworkList(ctx(t), list, annotated("pod-c-0003", podC.Path(), "pool,blue@net1,nosuch"))
	if skeintest.ErrCode(err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("ADD with an unknown network: %v", err)
	}
	harness.AssertSame(t, snapC, harness.Snapshot(t, podC))

	// Pod D is attached through skeind's API (as skeinctl pod attach
	// does), not through CNI: a CNI GC must leave it alone.
	podD := harness.NewNS(t, "pod")
	if _, err := podsGRPC(t, d).Attach(ctx(t), &rpc.PodAttachRequest{Id: "pod-d-0004", Netns: podD.Path(), Networks: []*rpc.PodNetwork{{Network: "blue", Ifname: "net1"}}}); err != nil {
		t.Fatalf("attach pod D: %v", err)
	}

	// GC from a runtime that no longer lists pod B (a fresh cache, so
	// libcni itself deletes nothing): skeind detaches B, keeps A and D.
	fresh := skeintest.NewCNI([]string{d.BinDir}, t.TempDir())
	if err := fresh.GCNetworkList(ctx(t), list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "pod-a-0001", IfName: "eth0"}}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := podB.Handle(t).LinkByName("net1"); err == nil {
		t.Error("GC left pod B's net1")
	}
	if _, err := podA.Handle(t).LinkByName("net2"); err != nil {
		t.Errorf("GC removed pod A's net2: %v", err)
	}
	if _, err := podD.Handle(t).LinkByName("net1"); err != nil {
		t.Errorf("CNI GC removed pod D's net1 (attached through the API): %v", err)
	}
	if _, err := pods(t, d).Detach(ctx(t), &rpc.PodRef{Id: "pod-d-0004"}); err != nil {
		t.Errorf("detach pod D: %v", err)
	}

	// An interface removed behind skeind's back: CHECK says which; DEL
	// still cleans up the rest.
	ha := podA.Handle(t)
	if l, err := ha.LinkByName("net2"); err == nil {
		if err := ha.LinkDel(l); err != nil {
			t.Fatal(err)
		}
	}
	if err := cni.CheckNetworkList(ctx(t), list, rtA); skeintest.ErrCode(err) != skeincni.CodeCheckFailed || !strings.Contains(err.Error(), "net2") {
		t.Errorf("CHECK with net2 gone: %v, want code %d naming net2", err, skeincni.CodeCheckFailed)
	}

	for i := range 2 { // DEL is idempotent
		if err := cni.DelNetworkList(ctx(t), list, rtA); err != nil {
			t.Fatalf("DEL #%d pod A: %v", i+1, err)
		}
	}
	if err := cni.DelNetworkList(ctx(t), list, rtB); err != nil {
		t.Fatalf("DEL pod B: %v", err)
	}
	for _, p := range []*harness.NS{podA, podB} {
		links, _ := p.Handle(t).LinkList()
		if len(links) != 1 {
			t.Errorf("%s keeps %d links after DEL, want lo only", p.Name(), len(links))
		}
	}
	if l, err := pods(t, d).List(ctx(t), &rpc.Empty{}); err != nil || len(l.Pods) != 0 {
		t.Errorf("pod records after DEL: %v %v", l, err)
	}
	if atts := d.Attachments(t); len(atts) != 0 {
		t.Errorf("skeind still holds %d attachments", len(atts))
	}
	// The bridges stay (the reference plugin never removes them; that is
	// the admin's business): once they are removed the node is as it was.
	nh := node.Handle(t)
	for _, br := range []string{"kbr-blue", "kbr-red"} {
		if l, err := nh.LinkByName(br); err == nil {
			_ = nh.LinkDel(l)
		}
	}
	harness.AssertSame(t, base, d.NodeState(t))
	harness.AssertHostSame(t, before, "after the pod network test")
}

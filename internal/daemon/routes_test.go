package daemon

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/prototext"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/routing"
)

func TestRoutingConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		c    RoutingConfig
		kube bool
		want string // error substring; "" = valid
	}{
		{"default", RoutingConfig{}, false, ""},
		{"export", RoutingConfig{Mode: "export"}, false, ""},
		{"direct on kube", RoutingConfig{Mode: "direct", NodeAddress: "192.0.2.1,2001:db8::1"}, true, ""},
		{"vxlan with settings", RoutingConfig{Mode: "vxlan", VXLAN: VXLANConfig{VNI: 1 << 20, Port: 8472, MTU: 1450}}, true, ""},
		{"unknown mode", RoutingConfig{Mode: "bgp"}, true, `--routing: routing mode "bgp"`},
		{"direct without kube", RoutingConfig{Mode: "direct"}, false, "--routing direct needs --store kubernetes"},
		{"vxlan without kube", RoutingConfig{Mode: "vxlan"}, false, "--routing vxlan needs --store kubernetes"},
		{"node address without kube", RoutingConfig{NodeAddress: "192.0.2.1"}, false, "--node-address needs --store kubernetes"},
		{"bad node address", RoutingConfig{Mode: "direct", NodeAddress: "192.0.2.1,192.0.2.2"}, true, "--node-address: node address list"},
		{"loopback node address", RoutingConfig{Mode: "direct", NodeAddress: "127.0.0.1"}, true, "--node-address"},
		{"vni out of range", RoutingConfig{Mode: "vxlan", VXLAN: VXLANConfig{VNI: 1 << 24}}, true, "--vxlan-vni 16777216: want 1..16777215"},
		{"negative vni", RoutingConfig{Mode: "vxlan", VXLAN: VXLANConfig{VNI: -1}}, true, "--vxlan-vni -1"},
		{"port out of range", RoutingConfig{Mode: "vxlan", VXLAN: VXLANConfig{Port: 70000}}, true, "--vxlan-port 70000: want 1..65535"},
		{"mtu too small", RoutingConfig{Mode: "vxlan", VXLAN: VXLANConfig{MTU: 576}}, true, "--vxlan-mtu 576: want 1280..65535"},
		{"vxlan setting in direct mode", RoutingConfig{Mode: "direct", VXLAN: VXLANConfig{Port: 8472}}, true, "--vxlan-port needs --routing vxlan"},
	} {
		mode, err := tt.c.Validate(tt.kube)
		if tt.want == "" {
			if err != nil || mode == "" {
				t.Errorf("%s: %q, %v; want valid", tt.name, mode, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v; want an error containing %q", tt.name, err, tt.want)
		}
	}
}

// fakeRoutes is a Routes with fixed statuses and one metric; SyncNow
// installs every route and counts the calls.
type fakeRoutes struct {
	mode    routing.Mode
	st      []routing.Status
	counter prometheus.Counter
	syncs   int
}

func (f *fakeRoutes) Mode() routing.Mode {
	if f.mode == "" {
		return routing.ModeVXLAN
	}
	return f.mode
}
func (f *fakeRoutes) Statuses() ([]routing.Status, bool) { return f.st, true }
func (f *fakeRoutes) SyncNow(context.Context) error {
	f.syncs++
	for i := range f.st {
		f.st[i].Installed, f.st[i].Reason = true, ""
	}
	return nil
}
func (f *fakeRoutes) Collectors() []prometheus.Collector { return []prometheus.Collector{f.counter} }

func TestListRoutes(t *testing.T) {
	// Embedded store: empty, with the configured mode.
	n := newTestNode(t, Config{})
	l, err := (&adminServer{d: n.d}).ListRoutes(context.Background(), &rpc.Empty{})
	if err != nil || l.Mode != "export" || len(l.Routes) != 0 {
		t.Errorf("ListRoutes without routing = %v, %v; want mode export and no routes", l, err)
	}

	st := []routing.Status{
		{Remote: routing.Remote{Block: netip.MustParsePrefix("10.1.0.0/27"), Name: "p-0", Node: "n2",
			NodeAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")}},
			Via: netip.MustParseAddr("192.0.2.2"), Installed: true},
		{Remote: routing.Remote{Block: netip.MustParsePrefix("fd01::/123"), Name: "p-1", Node: "n3"},
			Reason: "node has no address"},
	}
	fr := &fakeRoutes{st: st, counter: prometheus.NewCounter(prometheus.CounterOpts{Name: "skein_route_test_total", Help: "test"})}
	n = newTestNode(t, Config{Routes: fr})
	l, err = (&adminServer{d: n.d}).ListRoutes(context.Background(), &rpc.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	got := prototext.MarshalOptions{}.Format(l)
	want := `mode:"vxlan" synced:true ` +
		`routes:{block:"10.1.0.0/27" name:"p-0" node:"n2" node_addresses:"192.0.2.2" node_addresses:"2001:db8::2" mode:"vxlan" via:"192.0.2.2" installed:true} ` +
		`routes:{block:"fd01::/123" name:"p-1" node:"n3" mode:"vxlan" reason:"node has no address"}`
	if strings.Join(strings.Fields(got), " ") != want {
		t.Errorf("ListRoutes =\n%s\nwant\n%s", got, want)
	}
	mfs, err := n.d.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		found = found || mf.GetName() == "skein_route_test_total"
	}
	if !found {
		t.Error("the routes' metrics are not in the daemon's registry")
	}
}

// In export mode BIRD installs routes on its own schedule: ListRoutes syncs
// first, so it does not report a route missing that the kernel has (the
// periodic resync is 30 s). In the other modes it reports the last sync.
func TestListRoutesExportSyncsFirst(t *testing.T) {
	missing := func() []routing.Status {
		return []routing.Status{{Remote: routing.Remote{Block: netip.MustParsePrefix("10.1.0.0/27"), Name: "p-0", Node: "n2"},
			Reason: "no route for the block (export mode: a routing daemon must install it)"}}
	}
	for _, tt := range []struct {
		mode          routing.Mode
		syncs         int
		wantInstalled bool
	}{
		{routing.ModeExport, 1, true},
		{routing.ModeDirect, 0, false},
	} {
		fr := &fakeRoutes{mode: tt.mode, st: missing(), counter: prometheus.NewCounter(prometheus.CounterOpts{Name: "skein_route_test_total", Help: "test"})}
		n := newTestNode(t, Config{Routes: fr})
		l, err := (&adminServer{d: n.d}).ListRoutes(context.Background(), &rpc.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		if fr.syncs != tt.syncs || len(l.Routes) != 1 || l.Routes[0].Installed != tt.wantInstalled {
			t.Errorf("%s: ListRoutes = %v after %d syncs; want installed=%v after %d", tt.mode, l.Routes, fr.syncs, tt.wantInstalled, tt.syncs)
		}
	}
}

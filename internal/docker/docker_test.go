package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// fakePlumber records pairs instead of programming a kernel.
type fakePlumber struct {
	mu    sync.Mutex
	links map[string]dataplane.Pair
	fail  error
}

func (f *fakePlumber) SetupPair(p dataplane.Pair) (dataplane.Applied, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return dataplane.Applied{}, f.fail
	}
	if !strings.HasPrefix(p.Alias, f.Config().AliasPrefix) || len(p.Alias) > dataplane.MaxAliasLen {
		return dataplane.Applied{}, fmt.Errorf("alias %q does not fit: %w", p.Alias, dataplane.ErrInvalid)
	}
	f.links[p.HostName] = p
	return dataplane.Applied{}, nil
}

func (f *fakePlumber) Teardown(host, _, _ string, _ []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.links, host)
	return nil
}

func (f *fakePlumber) Config() dataplane.Config {
	return dataplane.Config{GatewayV4: dataplane.DefaultGatewayV4, GatewayV6: dataplane.DefaultGatewayV6, AliasPrefix: "skein:"}
}

type tenv struct {
	st  store.Store
	dp  *fakePlumber
	srv *httptest.Server
}

func newTenv(t *testing.T) *tenv {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := ipam.NewManager(ipam.Options{Store: st, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreatePool(context.Background(), store.Pool{Name: "default", Subnets: []netip.Prefix{
		netip.MustParsePrefix("10.64.0.0/16"), netip.MustParsePrefix("fd00:64::/112")}}); err != nil {
		t.Fatal(err)
	}
	dp := &fakePlumber{links: map[string]dataplane.Pair{}}
	d, err := New(Options{Store: st, IPAM: m, Dataplane: dp})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	return &tenv{st: st, dp: dp, srv: srv}
}

// post sends a raw body and returns the status and decoded reply.
func (e *tenv) post(t *testing.T, method string, body []byte) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(e.srv.URL+"/"+method, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/vnd.docker.plugins.v1+json" {
		t.Errorf("%s: Content-Type %q", method, ct)
	}
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: reply %q is not JSON: %v", method, b, err)
	}
	return resp.StatusCode, out
}

// call must succeed.
func (e *tenv) call(t *testing.T, method string, req any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(req)
	code, out := e.post(t, method, b)
	if code != http.StatusOK {
		t.Fatalf("%s %s: HTTP %d %v", method, b, code, out)
	}
	return out
}

// fail must fail with HTTP 500 and an Err containing want.
func (e *tenv) fail(t *testing.T, method string, req any, want string) {
	t.Helper()
	b, ok := req.([]byte)
	if !ok {
		b, _ = json.Marshal(req)
	}
	code, out := e.post(t, method, b)
	msg, _ := out["Err"].(string)
	if code != http.StatusInternalServerError || !strings.Contains(msg, want) {
		t.Errorf("%s %.80s: want HTTP 500 with Err containing %q, got %d %v", method, b, want, code, out)
	}
}

// state is everything the driver may change: records, attachments,
// pools, links.
func (e *tenv) state(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	var parts []string
	for _, k := range []string{kindAddrPool, kindNetwork} {
		m, err := e.st.ListMeta(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		for key, v := range m {
			parts = append(parts, k+"/"+key+"="+string(v))
		}
	}
	atts, _ := e.st.ListAttachments(ctx)
	for _, a := range atts {
		parts = append(parts, fmt.Sprintf("att %s %v", a.AttachmentKey, a.Addrs))
	}
	pools, _ := e.st.ListPools(ctx)
	for _, p := range pools {
		parts = append(parts, fmt.Sprintf("pool %s %v %v", p.Name, p.Subnets, p.Reserved))
	}
	e.dp.mu.Lock()
	for h := range e.dp.links {
		parts = append(parts, "link "+h)
	}
	e.dp.mu.Unlock()
	slices.Sort(parts)
	return strings.Join(parts, "\n")
}

const netID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// createNetwork runs Docker's sequence for `network create` and returns
// the pool IDs (v4 first).
func (e *tenv) createNetwork(t *testing.T, id string, v4, v6 string, gw4 string, aux map[string]string) []string {
	t.Helper()
	var ids []string
	req := createNetworkRequest{NetworkID: id, Options: map[string]any{optGeneric: map[string]any{}}}
	for _, f := range []struct {
		sn string
		v6 bool
	}{{v4, false}, {v6, true}} {
		if f.v6 && f.sn == "" {
			continue
		}
		r := e.call(t, "IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace, Pool: f.sn, V6: f.v6})
		pid, pool := r["PoolID"].(string), r["Pool"].(string)
		gwReq := requestAddressRequest{PoolID: pid, Options: map[string]string{optRequestAddrType: addrTypeGateway}}
		if !f.v6 {
			gwReq.Address = gw4
		}
		gw := e.call(t, "IpamDriver.RequestAddress", gwReq)["Address"].(string)
		data := ipamData{AddressSpace: LocalAddressSpace, Pool: pool, Gateway: gw, AuxAddresses: map[string]string{}}
		if !f.v6 {
			for name, a := range aux {
				e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pid, Address: a})
				data.AuxAddresses[name] = a + "/32"
			}
			req.IPv4Data = append(req.IPv4Data, data)
		} else {
			req.IPv6Data = append(req.IPv6Data, data)
		}
		ids = append(ids, pid)
	}
	e.call(t, "NetworkDriver.CreateNetwork", req)
	return ids
}

func TestActivateAndCapabilities(t *testing.T) {
	e := newTenv(t)
	if got := e.call(t, "Plugin.Activate", nil)["Implements"]; fmt.Sprint(got) != "[NetworkDriver IpamDriver]" {
		t.Errorf("Implements = %v", got)
	}
	c := e.call(t, "NetworkDriver.GetCapabilities", nil)
	if c["Scope"] != "local" || c["ConnectivityScope"] != "local" {
		t.Errorf("capabilities %v", c)
	}
	s := e.call(t, "IpamDriver.GetDefaultAddressSpaces", nil)
	if s["LocalDefaultAddressSpace"] != LocalAddressSpace || s["GlobalDefaultAddressSpace"] != GlobalAddressSpace {
		t.Errorf("address spaces %v", s)
	}
	e.call(t, "IpamDriver.GetCapabilities", nil)
	e.call(t, "NetworkDriver.DiscoverNew", map[string]any{"DiscoveryType": 1, "DiscoveryData": map[string]any{"Address": "x"}})
}

// TestLifecycle follows Docker's calls for a dual-stack network with a
// gateway and an aux address, one container, and removal; nothing stays.
func TestLifecycle(t *testing.T) {
	e := newTenv(t)
	before := e.state(t)
	pids := e.createNetwork(t, netID, "10.90.0.0/24", "fd00:90::/64", "10.90.0.1", map[string]string{"x": "10.90.0.2"})
	p, err := e.st.GetPool(context.Background(), PoolName(netID))
	if err != nil {
		t.Fatalf("CreateNetwork should create pool %s: %v", PoolName(netID), err)
	}
	if fmt.Sprint(p.Subnets) != "[10.90.0.0/24 fd00:90::/64]" || !slices.Contains(p.Reserved, "10.90.0.1") || !slices.Contains(p.Reserved, "10.90.0.2") {
		t.Errorf("pool %+v: want both subnets, gateway and aux reserved", p)
	}
	a4 := e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0]})["Address"].(string)
	a6 := e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[1]})["Address"].(string)
	if a4 != "10.90.0.3/24" || !strings.HasSuffix(a6, "/64") {
		t.Errorf("addresses %s %s: want the first free one with the network's mask", a4, a6)
	}
	ep := endpointRequest{NetworkID: netID, EndpointID: "ep1"}
	ce := e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "ep1", Interface: &endpointInterface{Address: a4, AddressIPv6: a6}})
	if mac, _ := ce["Interface"].(map[string]any)["MacAddress"].(string); mac == "" {
		t.Errorf("CreateEndpoint should choose the MAC: %v", ce)
	}
	e.assertOneOwner(t)
	j := e.call(t, "NetworkDriver.Join", joinRequest{NetworkID: netID, EndpointID: "ep1", SandboxKey: "/nonexistent"})
	routes, _ := json.Marshal(j["StaticRoutes"])
	// The IPv6 gateway is the endpoint's own: its host veth's link-local
	// address, from the MAC the driver chose for it.
	var gw6 string
	e.dp.mu.Lock()
	for _, p := range e.dp.links {
		gw6 = dataplane.LinkLocal(p.HostMAC).String()
	}
	e.dp.mu.Unlock()
	if gw6 == "" || gw6 == "fe80::1" || j["Gateway"] != "169.254.1.1" || j["GatewayIPv6"] != gw6 ||
		!strings.Contains(string(routes), `"Destination":"169.254.1.1/32","RouteType":1`) ||
		!strings.Contains(string(routes), `"Destination":"fd00:90::/65","NextHop":"`+gw6+`","RouteType":0`) ||
		!strings.Contains(string(routes), `"fd00:90:0:0:8000::/65"`) {
		t.Errorf("Join = %v", j)
	}
	if n, _ := j["InterfaceName"].(map[string]any); !strings.HasPrefix(n["SrcName"].(string), "skd") || n["DstPrefix"] != "eth" {
		t.Errorf("InterfaceName %v", n)
	}
	for _, m := range []string{"NetworkDriver.ProgramExternalConnectivity", "NetworkDriver.EndpointOperInfo", "NetworkDriver.RevokeExternalConnectivity", "NetworkDriver.Leave", "NetworkDriver.DeleteEndpoint"} {
		e.call(t, m, ep)
	}
	e.call(t, "IpamDriver.ReleaseAddress", releaseAddressRequest{PoolID: pids[0], Address: strings.Split(a4, "/")[0]})
	e.call(t, "IpamDriver.ReleaseAddress", releaseAddressRequest{PoolID: pids[1], Address: strings.Split(a6, "/")[0]})
	e.call(t, "IpamDriver.ReleaseAddress", releaseAddressRequest{PoolID: pids[0], Address: "10.90.0.2"})
	e.call(t, "IpamDriver.ReleaseAddress", releaseAddressRequest{PoolID: pids[0], Address: "10.90.0.1"})
	for _, id := range pids {
		e.call(t, "IpamDriver.ReleasePool", releasePoolRequest{PoolID: id})
	}
	e.call(t, "NetworkDriver.DeleteNetwork", networkRequest{NetworkID: netID})
	if after := e.state(t); after != before {
		t.Errorf("after removal the store should be as before:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestBadInput: every mistake is a 500 with a clear Err, and changes
// nothing.
func TestBadInput(t *testing.T) {
	e := newTenv(t)
	pids := e.createNetwork(t, netID, "10.91.0.0/30", "", "", nil) // .1 and .2 usable
	used := e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0], Address: "10.91.0.1"})["Address"].(string)
	e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "ep1", Interface: &endpointInterface{Address: used}})
	e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0]}) // .2: now full
	before := e.state(t)

	big := append([]byte(`{"NetworkID":"`), bytes.Repeat([]byte("a"), MaxBody)...)
	big = append(big, `"}`...)
	for _, c := range []struct {
		method string
		req    any
		want   string
	}{
		{"NetworkDriver.CreateNetwork", []byte(`{"NetworkID": 1`), "malformed JSON"},
		{"NetworkDriver.CreateNetwork", big, "larger than"},
		{"IpamDriver.RequestPool", requestPoolRequest{AddressSpace: "other", Pool: "10.1.0.0/24"}, "unknown address space"},
		{"IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace, Pool: "10.64.1.0/24"}, `overlaps subnet 10.64.0.0/16 of skein pool "default"`},
		{"IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace, Pool: "10.91.0.0/30"}, "overlaps"},
		{"IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace, Pool: "10.1.0.1/24"}, "host bits"},
		{"IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace, Pool: "fd00::/64"}, "is not IPv4"},
		{"IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace, Options: map[string]string{OptPool: "nope"}}, "does not exist"},
		{"IpamDriver.RequestAddress", requestAddressRequest{PoolID: "nope"}, "unknown IPAM pool"},
		{"IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0]}, "no free IPv4 address"},
		{"IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0], Address: "10.91.0.1"}, "already in use"},
		{"IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0], Address: "10.91.0.3"}, "reserved"},
		{"IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0], Address: "10.64.0.9"}, "not in subnet"},
		{"IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0], Address: "banana"}, "not an IP address"},
		{"IpamDriver.ReleasePool", releasePoolRequest{PoolID: "nope"}, "unknown IPAM pool"},
		{"NetworkDriver.CreateNetwork", createNetworkRequest{NetworkID: netID}, "already exists"},
		{"NetworkDriver.CreateNetwork", createNetworkRequest{NetworkID: "n2", IPv4Data: []ipamData{{Pool: "172.17.0.0/16"}}}, "--ipam-driver"},
		{"NetworkDriver.DeleteNetwork", networkRequest{NetworkID: "nope"}, "unknown network"},
		{"NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: "nope", EndpointID: "e"}, "unknown network"},
		{"NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "e2", Interface: &endpointInterface{Address: "10.64.0.5/16"}}, "not in skein pool"},
		{"NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "e2"}, "no address"},
		{"NetworkDriver.Join", joinRequest{NetworkID: netID, EndpointID: "nope"}, "unknown endpoint"},
		{"NetworkDriver.Leave", endpointRequest{NetworkID: netID}, "EndpointID is required"},
		{"NetworkDriver.DeleteEndpoint", endpointRequest{NetworkID: netID, EndpointID: "nope"}, "unknown endpoint"},
		{"NetworkDriver.EndpointOperInfo", endpointRequest{NetworkID: netID, EndpointID: "nope"}, "unknown endpoint"},
	} {
		e.fail(t, c.method, c.req, c.want)
		if after := e.state(t); after != before {
			t.Fatalf("%s %v changed the state:\nbefore:\n%s\nafter:\n%s", c.method, c.req, before, after)
		}
	}
	resp, err := http.Get(e.srv.URL + "/Plugin.Activate")
	if err == nil {
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("GET should be refused: %v %v", resp, err)
	}

	// A dataplane failure leaves no endpoint record.
	e.dp.fail = fmt.Errorf("boom: %w", dataplane.ErrLinkExists)
	e.call(t, "IpamDriver.ReleaseAddress", releaseAddressRequest{PoolID: pids[0], Address: "10.91.0.2"})
	before = e.state(t)
	e.fail(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "e3", Interface: &endpointInterface{Address: "10.91.0.2/30"}}, "boom")
	if after := e.state(t); after != before {
		t.Errorf("a failed CreateEndpoint left state:\n%s", after)
	}
}

// TestNoSubnetLoop: Docker repeats RequestPool without --subnet while the
// answer overlaps a host route; skein refuses before that loops forever.
func TestNoSubnetLoop(t *testing.T) {
	e := newTenv(t)
	for i := 0; i < maxUnbound; i++ {
		e.call(t, "IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace})
	}
	e.fail(t, "IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace}, "give --subnet")
}

func TestGatewayRoute(t *testing.T) {
	gw := netip.MustParseAddr("169.254.1.1")
	taken := map[netip.Prefix]bool{}
	for _, want := range []string{"169.254.1.1/32", "169.254.1.0/31", "169.254.1.0/30"} {
		got := gatewayRoute(gw, taken)
		if got.String() != want {
			t.Errorf("gatewayRoute = %s, want %s", got, want)
		}
		taken[got] = true
	}
	if h := halves(netip.MustParsePrefix("fd00:1::/64")); fmt.Sprint(h) != "[fd00:1::/65 fd00:1:0:0:8000::/65]" {
		t.Errorf("halves = %v", h)
	}
}

// TestJoinLegacyGateway6: an endpoint recorded before each host veth's own
// link-local address became the IPv6 gateway (its record names no
// gateway6; its host veth carries the shared one) is still joined through
// the shared GatewayV6.
func TestJoinLegacyGateway6(t *testing.T) {
	e := newTenv(t)
	pids := e.createNetwork(t, netID, "10.93.0.0/24", "fd00:93::/64", "", nil)
	a4 := e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0]})["Address"].(string)
	a6 := e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[1]})["Address"].(string)
	e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "old", Interface: &endpointInterface{Address: a4, AddressIPv6: a6}})
	ctx := context.Background()
	rec, err := e.st.GetAttachment(ctx, endpointKey(netID, "old"))
	if err != nil {
		t.Fatal(err)
	}
	var x map[string]any
	if err := json.Unmarshal(rec.Extra, &x); err != nil || x["gateway6"] == nil {
		t.Fatalf("a new dual-stack endpoint's record should name its gateway6: %s (%v)", rec.Extra, err)
	}
	delete(x, "gateway6")
	rec.Extra, _ = json.Marshal(x)
	if err := e.st.UpdateAttachment(ctx, rec); err != nil {
		t.Fatal(err)
	}
	j := e.call(t, "NetworkDriver.Join", joinRequest{NetworkID: netID, EndpointID: "old", SandboxKey: "/nonexistent"})
	if j["GatewayIPv6"] != "fe80::1" {
		t.Errorf("Join of a legacy endpoint: GatewayIPv6 = %v, want the shared fe80::1", j["GatewayIPv6"])
	}
}

// assertOneOwner: every address is owned by exactly one record (a lease);
// endpoints only borrow theirs, so skeind restores each address once.
func (e *tenv) assertOneOwner(t *testing.T) {
	t.Helper()
	atts, err := e.st.ListAttachments(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	owners := map[netip.Addr]int{}
	for _, a := range atts {
		if a.HostLink != "" && !a.Borrowed {
			t.Errorf("endpoint %s owns its addresses %v; its leases do", a.AttachmentKey, a.Addrs)
		}
		if !a.Borrowed {
			for _, ad := range a.Addrs {
				owners[ad]++
			}
		}
	}
	for _, a := range atts {
		for _, ad := range a.Addrs {
			if owners[ad] != 1 {
				t.Errorf("address %v of %s has %d owning records, want 1", ad, a.AttachmentKey, owners[ad])
			}
		}
	}
}

// TestMarkBorrowed: endpoint records from before Borrowed existed are
// marked when the driver starts; leases and other front doors' records
// are left alone.
func TestMarkBorrowed(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := ipam.NewManager(ipam.Options{Store: st, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	addr := []netip.Addr{netip.MustParseAddr("10.64.0.9")}
	old := []store.Attachment{
		{AttachmentKey: endpointKey("n", "ep"), Addrs: addr, HostLink: "skold", Owner: Owner},
		{AttachmentKey: leaseKey("pool", addr[0]), Addrs: addr, Owner: Owner},
		{AttachmentKey: store.AttachmentKey{Network: "cni", ContainerID: "c", IfName: "eth0"}, Addrs: addr, HostLink: "skcni", Owner: "cni"},
	}
	for _, a := range old {
		if err := st.PutAttachment(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := New(Options{Store: st, IPAM: m, Dataplane: &fakePlumber{}}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		a, err := st.GetAttachment(ctx, old[i].AttachmentKey)
		if err != nil || a.Borrowed != want {
			t.Errorf("%s: borrowed %v (err %v), want %v", old[i].AttachmentKey, a.Borrowed, err, want)
		}
	}
}

// TestLongIDs: Docker does not bound network and endpoint IDs; an endpoint
// with long ones still gets a host link whose tag fits the kernel's alias
// limit and names it.
func TestLongIDs(t *testing.T) {
	e := newTenv(t)
	id := strings.Repeat("d", 200)
	pids := e.createNetwork(t, id, "10.90.0.0/24", "", "", nil)
	a4 := e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0]})["Address"].(string)
	for _, ep := range []string{strings.Repeat("e", 300) + "1", strings.Repeat("e", 300) + "2"} {
		e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: id, EndpointID: ep, Interface: &endpointInterface{Address: a4}})
	}
	e.dp.mu.Lock()
	defer e.dp.mu.Unlock()
	aliases := map[string]bool{}
	for _, p := range e.dp.links {
		if len(p.Alias) > dataplane.MaxAliasLen || !strings.HasPrefix(p.Alias, "skein:docker:ddd") || !strings.HasSuffix(p.Alias, ":eth") {
			t.Errorf("alias %q (%d bytes)", p.Alias, len(p.Alias))
		}
		aliases[p.Alias] = true
	}
	if len(aliases) != 2 {
		t.Errorf("two endpoints, %d distinct aliases: %v", len(aliases), aliases)
	}
}

// TestForgottenEndpoints: endpoints Docker no longer knows — a
// CreateEndpoint whose answer a crash of skeind or dockerd lost (the
// record, with or without its link), which Docker never deletes but may
// create again, or a DeleteEndpoint that failed and Docker only logged —
// neither block a later CreateEndpoint of the same ID nor outlive their
// network: nothing of them, of the network or of its pool is left, and
// the subnet can be used again.
func TestForgottenEndpoints(t *testing.T) {
	ctx := context.Background()
	e := newTenv(t)
	pids := e.createNetwork(t, netID, "10.90.0.0/24", "", "", nil)
	addr := func() string {
		return e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: pids[0]})["Address"].(string)
	}
	a1, a2 := addr(), addr()
	links := func() int { e.dp.mu.Lock(); defer e.dp.mu.Unlock(); return len(e.dp.links) }
	endpoints := func() (eps []string) {
		atts, err := e.st.ListAttachments(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range atts {
			if a.Network == endpointKey(netID, "").Network {
				eps = append(eps, a.ContainerID)
			}
		}
		return eps
	}

	// ep1: its record and link made, the answer lost; then the link gone
	// too (a crash before the kernel work). Docker creates it again.
	e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "ep1", Interface: &endpointInterface{Address: a1}})
	e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "ep1", Interface: &endpointInterface{Address: a1}})
	if n := links(); n != 1 {
		t.Fatalf("ep1 created twice: %d links, want 1", n)
	}
	e.dp.mu.Lock()
	clear(e.dp.links)
	e.dp.mu.Unlock()
	e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "ep1", Interface: &endpointInterface{Address: a1}})
	if eps := endpoints(); len(eps) != 1 || links() != 1 {
		t.Fatalf("ep1 after a crash before its link and a new CreateEndpoint: records %v, %d links; want ep1's and 1", eps, links())
	}

	// ep2: made, and Docker forgot it (its CreateEndpoint failed on
	// Docker's side after ours succeeded). Docker then removes the
	// network: its addresses and pool first, then DeleteNetwork.
	e.call(t, "NetworkDriver.CreateEndpoint", createEndpointRequest{NetworkID: netID, EndpointID: "ep2", Interface: &endpointInterface{Address: a2}})
	for _, a := range []string{a1, a2} {
		e.call(t, "IpamDriver.ReleaseAddress", releaseAddressRequest{PoolID: pids[0], Address: strings.Split(a, "/")[0]})
	}
	e.call(t, "IpamDriver.ReleasePool", releasePoolRequest{PoolID: pids[0]})
	e.call(t, "NetworkDriver.DeleteNetwork", networkRequest{NetworkID: netID})
	if atts, _ := e.st.ListAttachments(ctx); len(atts) != 0 || links() != 0 {
		t.Errorf("after the network's delete: records %v, %d links; want none", atts, links())
	}
	if got := e.state(t); strings.Contains(got, "docker-") {
		t.Errorf("the network or its pool outlived it:\n%s", got)
	}
	e.createNetwork(t, netID[:63]+"e", "10.90.0.0/24", "", "", nil)
}

// TestDualStackSizes: a network whose IPv6 subnet is smaller than its
// IPv4 one is refused at its creation, naming the sizes: it used to be
// made with as many IPv4 addresses as the IPv6 subnet has (a /24 with a
// /126 gave 3), and --ip in the rest of the /24 was "not in the pool".
func TestDualStackSizes(t *testing.T) {
	e := newTenv(t)
	req := createNetworkRequest{NetworkID: netID, Options: map[string]any{optGeneric: map[string]any{}}}
	for _, f := range []struct {
		sn string
		v6 bool
	}{{"10.90.0.0/24", false}, {"fd00:90::/126", true}} {
		r := e.call(t, "IpamDriver.RequestPool", requestPoolRequest{AddressSpace: LocalAddressSpace, Pool: f.sn, V6: f.v6})
		gw := e.call(t, "IpamDriver.RequestAddress", requestAddressRequest{PoolID: r["PoolID"].(string),
			Options: map[string]string{optRequestAddrType: addrTypeGateway}})["Address"].(string)
		data := ipamData{AddressSpace: LocalAddressSpace, Pool: r["Pool"].(string), Gateway: gw}
		if f.v6 {
			req.IPv6Data = append(req.IPv6Data, data)
		} else {
			req.IPv4Data = append(req.IPv4Data, data)
		}
	}
	e.fail(t, "NetworkDriver.CreateNetwork", req, "is smaller than the IPv4 subnet 10.90.0.0/24")
}

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// callTimeout bounds one libcni call; skeind answers in milliseconds.
const callTimeout = 30 * time.Second

// env is one skeind serving one node namespace for one test, with a libcni
// runtime that finds the skein binary and the reference plugins.
type env struct {
	d   *skeintest.Daemon
	cni *libcni.CNIConfig
	// base is the node namespace right after skeind started.
	base harness.State
}

func newEnv(t *testing.T, o skeintest.Options) *env {
	t.Helper()
	harness.RequireRoot(t)
	d := skeintest.StartDaemon(t, o)
	return &env{d: d, cni: d.CNI(), base: nodeState(t, d)}
}

// nodeState snapshots the node namespace, its export table checked
// against the blocks skeind owns (skeintest.Daemon.NodeState).
func nodeState(t testing.TB, d *skeintest.Daemon) harness.State {
	t.Helper()
	return d.NodeState(t)
}

// assertNothingLeft checks that the node namespace is as skeind left it at
// start and that skeind holds no attachment.
func (e *env) assertNothingLeft(t *testing.T) {
	t.Helper()
	harness.AssertSame(t, e.base, nodeState(t, e.d))
	if atts := e.d.Attachments(t); len(atts) != 0 {
		t.Errorf("after every DEL skeind should hold no attachment; it holds %d: %s", len(atts), describe(atts))
	}
}

// list is a one-plugin conflist for skein with extra netconf fields.
func (e *env) list(t testing.TB, name, version string, extra skeintest.Plugin) *libcni.NetworkConfigList {
	t.Helper()
	return skeintest.ConfList(t, name, version, e.d.SkeinPlugin(extra))
}

// ctx is a context for one call made on the test's goroutine.
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// add, del and check are safe to call from several goroutines.

func (e *env) add(_ testing.TB, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (types.Result, error) {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return e.cni.AddNetworkList(c, l, rt)
}

func (e *env) del(_ testing.TB, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return e.cni.DelNetworkList(c, l, rt)
}

func (e *env) check(_ testing.TB, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return e.cni.CheckNetworkList(c, l, rt)
}

// pod is one successful ADD.
type pod struct {
	ns    *harness.NS
	rt    *libcni.RuntimeConf
	res   *types100.Result
	addrs []netip.Addr // of the container interface, from the result
}

func (p *pod) addr(v6 bool) netip.Addr {
	for _, a := range p.addrs {
		if a.Is6() == v6 {
			return a
		}
	}
	return netip.Addr{}
}

// mustAdd attaches ns as container id (interface eth0) and fails the test
// if ADD does not succeed.
func (e *env) mustAdd(t testing.TB, l *libcni.NetworkConfigList, ns *harness.NS, id string) *pod {
	t.Helper()
	rt := skeintest.RT(id, ns.Path(), "eth0")
	r, err := e.add(t, l, rt)
	if err != nil {
		t.Fatalf("ADD %s to network %s: the spec expects a result, got error: %v", id, l.Name, err)
	}
	res := asCurrent(t, r)
	return &pod{ns: ns, rt: rt, res: res, addrs: ctrAddrs(res, rt.IfName, ns.Path())}
}

func (e *env) mustDel(t testing.TB, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	t.Helper()
	if err := e.del(t, l, rt); err != nil {
		t.Errorf("DEL %s from network %s: the spec expects success, got: %v", rt.ContainerID, l.Name, err)
	}
}

// asCurrent converts any result to the 1.0.0 types.
func asCurrent(t testing.TB, r types.Result) *types100.Result {
	t.Helper()
	res, err := asCurrentErr(r)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func asCurrentErr(r types.Result) (*types100.Result, error) {
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		return nil, fmt.Errorf("convert result %v: %w", r, err)
	}
	return res, nil
}

// ctrAddrs returns the addresses the result assigns to interface ifName in
// sandbox netns.
func ctrAddrs(res *types100.Result, ifName, netns string) []netip.Addr {
	var out []netip.Addr
	for _, ip := range res.IPs {
		if ip.Interface == nil || *ip.Interface < 0 || *ip.Interface >= len(res.Interfaces) {
			continue
		}
		if i := res.Interfaces[*ip.Interface]; i.Name == ifName && i.Sandbox == netns {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

// wantCode fails unless err is a spec error with code.
func wantCode(t testing.TB, what string, err error, code uint) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: expected error code %d, got success", what, code)
		return
	}
	if got := skeintest.ErrCode(err); got != code {
		t.Errorf("%s: expected error code %d, got code %d: %v", what, code, got, err)
	}
}

// ping pings addr from ns, retrying briefly (a fresh neighbour entry may
// drop the first packet).
func ping(t testing.TB, from *harness.NS, addr netip.Addr) error {
	t.Helper()
	var err error
	for i := 0; i < 3; i++ {
		if err = harness.Ping(t, from, addr); err == nil {
			return nil
		}
	}
	return err
}

// mustReach fails the test for every address of to that from cannot ping.
func mustReach(t testing.TB, from *harness.NS, what string, to ...netip.Addr) {
	t.Helper()
	for _, a := range to {
		if err := ping(t, from, a); err != nil {
			t.Errorf("%s: %s should answer ping from %s (routed veth via the node): %v", what, a, from.Name(), err)
		}
	}
}

func describe(atts []*rpc.Attachment) string {
	var s []string
	for _, a := range atts {
		s = append(s, fmt.Sprintf("%s/%s/%s%v", a.Network, a.ContainerId, a.Ifname, a.Addresses))
	}
	return strings.Join(s, ", ")
}

// attKeys returns "network/container/ifname" of every attachment.
func attKeys(atts []*rpc.Attachment) []string {
	var s []string
	for _, a := range atts {
		s = append(s, a.Network+"/"+a.ContainerId+"/"+a.Ifname)
	}
	slices.Sort(s)
	return s
}

// hostLinks returns the names of every link in the node namespace but lo,
// sorted. A test node has nothing else, so these are skein's host veths —
// including any it failed to tag.
func hostLinks(t testing.TB, node *harness.NS) []string {
	t.Helper()
	links, err := node.Handle(t).LinkList()
	if err != nil {
		t.Fatalf("list node links: %v", err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			out = append(out, l.Attrs().Name)
		}
	}
	slices.Sort(out)
	return out
}

// untaggedLinks returns the node's links (but lo) without skein's alias.
func untaggedLinks(t testing.TB, node *harness.NS) []string {
	t.Helper()
	links, err := node.Handle(t).LinkList()
	if err != nil {
		t.Fatalf("list node links: %v", err)
	}
	var out []string
	for _, l := range links {
		if a := l.Attrs(); a.Name != "lo" && !strings.HasPrefix(a.Alias, "skein:") {
			out = append(out, a.Name)
		}
	}
	return out
}

// poolUsed is the number of addresses skeind counts as used in pool.
func (e *env) poolUsed(t testing.TB, pool string) uint64 {
	t.Helper()
	p, err := e.d.Admin(t).GetPool(ctx(t), &rpc.PoolRef{Name: pool})
	if err != nil {
		t.Fatalf("get pool %s: %v", pool, err)
	}
	return p.Used
}

func (e *env) createPool(t testing.TB, name string, bits uint32, subnets ...string) {
	t.Helper()
	if _, err := e.d.Admin(t).CreatePool(ctx(t), &rpc.Pool{Name: name, Subnets: subnets, BlockSizeBits: bits}); err != nil {
		t.Fatalf("create pool %s %v: %v", name, subnets, err)
	}
}

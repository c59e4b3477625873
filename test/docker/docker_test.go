// Package docker_test drives skein's Docker front door with a real Docker
// engine (Debian's docker.io): dockerd runs inside a node namespace that
// skeind serves, creates skein networks and runs busybox containers on
// them; the tests check what Docker shows, what containers reach, and that
// skeind and the kernel hold nothing of them afterwards.
package docker_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/docker"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

var gw4 = netip.MustParseAddr("169.254.1.1")

// TestNetworks runs the network shapes a user creates, one engine for all.
func TestNetworks(t *testing.T) {
	e := newEnv(t)

	t.Run("default pool", func(t *testing.T) {
		e.network(t, "plain")
		a, b := e.run(t, "plain-a", "--net", "plain"), e.run(t, "plain-b", "--net", "plain")
		aa, ba := e.addrs(t, a, "plain"), e.addrs(t, b, "plain")
		pool := netip.MustParsePrefix("10.64.0.0/16")
		if len(aa) != 1 || len(ba) != 1 || !pool.Contains(aa[0]) || !pool.Contains(ba[0]) || aa[0] == ba[0] {
			t.Fatalf("containers on the default pool should get distinct addresses in %s: %v, %v", pool, aa, ba)
		}
		if gw := e.mustDocker(t, "inspect", "-f", "{{.NetworkSettings.Networks.plain.Gateway}}", a); gw != gw4.String() {
			t.Errorf("container gateway: want %s (the node's link-local gateway), Docker shows %q", gw4, gw)
		}
		ep := e.mustDocker(t, "inspect", "-f", "{{.NetworkSettings.Networks.plain.EndpointID}}", a)
		if got := e.endpointAddrs(t, ep); !slices.Equal(got, aa) {
			t.Errorf("docker inspect shows %v, skeind's endpoint holds %v", aa, got)
		}
		e.ping(t, a, ba[0])
		e.ping(t, b, aa[0])
		e.ping(t, a, nodeAddr)
		e.ping(t, a, gw4)
		if out := e.mustDocker(t, "exec", a, "ip", "link"); strings.Contains(out, "gwbridge") {
			t.Errorf("container has a docker_gwbridge link: %s", out)
		}
		e.mustDocker(t, "rm", "-f", a, b)
		e.mustDocker(t, "network", "rm", "plain")
		e.assertClean(t)
	})

	t.Run("subnet ip-range gateway aux static", func(t *testing.T) {
		id := e.network(t, "ranged", "--subnet", "10.91.0.0/24", "--ip-range", "10.91.0.128/28",
			"--gateway", "10.91.0.1", "--aux-address", "reserved=10.91.0.128")
		if got, want := e.pools(t), []string{"default", docker.PoolName(id)}; !slices.Equal(got, want) {
			t.Errorf("a new --subnet should create pool %s: pools %v", want[1], got)
		}
		cfg := e.mustDocker(t, "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{.IPRange}} {{.Gateway}}{{end}}", "ranged")
		if cfg != "10.91.0.0/24 10.91.0.128/28 10.91.0.1" {
			t.Errorf("docker network inspect shows %q", cfg)
		}
		a := e.run(t, "ranged-a", "--net", "ranged")
		aa := e.addrs(t, a, "ranged")
		if want := netip.MustParseAddr("10.91.0.129"); len(aa) != 1 || aa[0] != want {
			t.Errorf("first dynamic address: want %s (in --ip-range, after the aux address), got %v", want, aa)
		}
		b := e.run(t, "ranged-b", "--net", "ranged", "--ip", "10.91.0.7")
		if ba := e.addrs(t, b, "ranged"); len(ba) != 1 || ba[0] != netip.MustParseAddr("10.91.0.7") {
			t.Errorf("--ip 10.91.0.7 gave %v", ba)
		}
		if mask := e.mustDocker(t, "exec", a, "ip", "-4", "addr", "show", "eth0"); !strings.Contains(mask, "10.91.0.129/24") {
			t.Errorf("Docker should set the address with the network's mask (/24): %s", mask)
		}
		e.ping(t, a, netip.MustParseAddr("10.91.0.7"))
		e.ping(t, b, aa[0])
		for _, c := range []struct{ what, ip, want string }{
			{"--ip in use", "10.91.0.7", "already in use"},
			{"--ip is the gateway", "10.91.0.1", "reserved"},
			{"--ip is an aux address", "10.91.0.128", "reserved"},
			{"--ip is the broadcast address", "10.91.0.255", "reserved"},
		} {
			e.wantDockerError(t, c.what, []string{"run", "--rm", "--net", "ranged", "--ip", c.ip, image, "true"}, c.want)
		}
		e.mustDocker(t, "rm", "-f", a, b)
		e.mustDocker(t, "network", "rm", "ranged")
		e.assertClean(t)
	})

	t.Run("dual stack", func(t *testing.T) {
		e.network(t, "dual", "--ipv6", "--subnet", "10.92.0.0/24", "--subnet", "fd00:92::/64")
		a, b := e.run(t, "dual-a", "--net", "dual"), e.run(t, "dual-b", "--net", "dual", "--ip6", "fd00:92::99")
		aa, ba := e.addrs(t, a, "dual"), e.addrs(t, b, "dual")
		if len(aa) != 2 || len(ba) != 2 || ba[1] != netip.MustParseAddr("fd00:92::99") {
			t.Fatalf("dual-stack containers should get one address per family: %v, %v", aa, ba)
		}
		for _, ad := range ba {
			e.ping(t, a, ad)
		}
		for _, ad := range aa {
			e.ping(t, b, ad)
		}
		e.ping(t, a, nodeAddr)
		e.mustDocker(t, "rm", "-f", a, b)
		e.mustDocker(t, "network", "rm", "dual")
		e.assertClean(t)
	})

	t.Run("existing pool", func(t *testing.T) {
		if _, err := e.sk.Admin(t).CreatePool(context.Background(), &rpc.Pool{Name: "shared", Subnets: []string{"10.93.0.0/24"}}); err != nil {
			t.Fatal(err)
		}
		defer e.sk.Admin(t).DeletePool(context.Background(), &rpc.PoolRef{Name: "shared"})
		e.network(t, "onpool", "-o", "skein.pool=shared", "--ipam-opt", "skein.pool=shared")
		// The identical subnet of a pool selects it too.
		e.network(t, "bysubnet", "--subnet", "10.93.0.0/24")
		a, b := e.run(t, "pool-a", "--net", "onpool"), e.run(t, "pool-b", "--net", "bysubnet")
		aa, ba := e.addrs(t, a, "onpool"), e.addrs(t, b, "bysubnet")
		sn := netip.MustParsePrefix("10.93.0.0/24")
		if len(aa) != 1 || len(ba) != 1 || !sn.Contains(aa[0]) || !sn.Contains(ba[0]) || aa[0] == ba[0] {
			t.Fatalf("both networks should take distinct addresses from pool shared (%s): %v, %v", sn, aa, ba)
		}
		e.ping(t, a, ba[0])
		e.mustDocker(t, "rm", "-f", a, b)
		e.mustDocker(t, "network", "rm", "onpool", "bysubnet")
		e.assertClean(t, "shared") // a pool the network did not create stays
	})

	t.Run("connect and disconnect", func(t *testing.T) {
		e.network(t, "first", "--subnet", "10.94.0.0/24")
		e.network(t, "second", "--subnet", "10.95.0.0/24")
		a := e.run(t, "conn-a", "--net", "first")
		b := e.run(t, "conn-b", "--net", "second")
		e.mustDocker(t, "network", "connect", "second", a)
		ba := e.addrs(t, b, "second")
		if out := e.mustDocker(t, "exec", a, "ip", "-4", "addr", "show", "eth1"); !strings.Contains(out, "10.95.0.") {
			t.Errorf("after network connect the container should have eth1 in 10.95.0.0/24: %s", out)
		}
		e.ping(t, a, ba[0])
		if n := len(e.dockerAttachments(t)); n != 3+3 {
			t.Errorf("want 3 endpoints and 3 leases in skeind, have %d attachments", n)
		}
		e.mustDocker(t, "network", "disconnect", "second", a)
		if n := len(e.dockerAttachments(t)); n != 2+2 {
			t.Errorf("after disconnect want 2 endpoints and 2 leases, have %d attachments", n)
		}
		e.mustDocker(t, "stop", "-t", "0", a)
		e.mustDocker(t, "start", a)
		e.ping(t, b, e.addrs(t, a, "first")[0])
		e.mustDocker(t, "rm", "-f", a, b)
		e.mustDocker(t, "network", "rm", "first", "second")
		e.assertClean(t)
	})
}

// TestBadInput: mistakes give errors that say what is wrong, and change
// nothing in skeind or the kernel.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	e.network(t, "tiny", "--subnet", "10.96.0.0/30") // .1 and .2 usable
	base := nodeState(t, e.sk)
	n := len(e.dockerAttachments(t))
	pools := e.pools(t)
	create := func(flags ...string) []string {
		return append(append([]string{"network", "create", "-d", e.driver, "--ipam-driver", e.driver}, flags...), "bad-"+harness.RandHex(3))
	}
	for _, c := range []struct {
		what string
		args []string
		want []string
	}{
		{"subnet overlapping a pool", create("--subnet", "10.64.3.0/24"), []string{"overlaps", "10.64.0.0/16", "default"}},
		{"subnet overlapping a Docker network", create("--subnet", "10.96.0.0/24"), []string{"overlaps"}},
		{"unknown pool", create("--ipam-opt", "skein.pool=nope"), []string{`"nope" does not exist`}},
		{"-o pool without --ipam-opt", create("-o", "skein.pool=default", "--subnet", "10.97.0.0/24"), []string{"skein.pool"}},
		{"unknown skein option", create("-o", "skein.pol=x"), []string{"unknown option"}},
		{"other IPAM driver", []string{"network", "create", "-d", e.driver, "bad-ipam"}, []string{"--ipam-driver"}},
		{"mixed families", create("--ipv6", "--subnet", "fd00:97::/64"), []string{"every address family"}},
		{"--ip outside the subnet", []string{"run", "--rm", "--net", "tiny", "--ip", "10.64.0.9", image, "true"}, []string{"does not belong"}}, // Docker checks this one itself
	} {
		e.wantDockerError(t, c.what, c.args, c.want...)
	}
	a, b := e.run(t, "tiny-a", "--net", "tiny"), e.run(t, "tiny-b", "--net", "tiny")
	e.wantDockerError(t, "exhausted pool", []string{"run", "--rm", "--net", "tiny", image, "true"}, "no free IPv4 address")
	e.mustDocker(t, "rm", "-f", a, b)
	if got := len(e.dockerAttachments(t)); got != n {
		t.Errorf("failed requests left attachments: %d before, %d after", n, got)
	}
	if got := e.pools(t); !slices.Equal(got, pools) {
		t.Errorf("failed requests changed the pools: %v, now %v", pools, got)
	}
	harness.AssertSame(t, base, nodeState(t, e.sk))
	e.mustDocker(t, "network", "rm", "tiny")
	e.assertClean(t)
}

// TestRestart: skeind restarts (graceful and crash) while containers run;
// Docker, which never activates a plugin twice, keeps working with them.
// Then dockerd restarts: its networks still work.
func TestRestart(t *testing.T) {
	e := newEnv(t)
	e.network(t, "keep", "--ipv6", "--subnet", "10.98.0.0/24", "--subnet", "fd00:98::/64")
	a := e.run(t, "keep-a", "--net", "keep")
	aa := e.addrs(t, a, "keep")
	for i, how := range []string{"stop", "kill"} {
		if how == "stop" {
			e.sk.Stop(t)
		} else {
			e.sk.Kill(t)
		}
		e.sk.Start(t)
		// Each address is restored once, from its lease; the endpoint only
		// routes it: no "restored twice", nothing skeind cannot restore.
		if log := e.sk.Log(); strings.Contains(log, "level=ERROR") {
			t.Errorf("skeind logged errors starting after %s:\n%s", how, log)
		}
		b := e.run(t, fmt.Sprintf("keep-b%d", i), "--net", "keep")
		ba := e.addrs(t, b, "keep")
		for _, ad := range ba {
			if slices.Contains(aa, ad) {
				t.Errorf("after skeind %s a new container got %s, which %s holds", how, ad, a)
			}
			e.ping(t, a, ad)
		}
		e.ping(t, b, aa[0])
		if out := e.mustDocker(t, "network", "inspect", "-f", "{{len .Containers}}", "keep"); out != "2" {
			t.Errorf("network inspect after skeind %s: %s containers, want 2", how, out)
		}
		e.mustDocker(t, "rm", "-f", b)
	}
	e.mustDocker(t, "rm", "-f", a)

	e.stopDockerd(t)
	e.startDockerd(t)
	c := e.run(t, "after-dockerd", "--net", "keep")
	e.ping(t, c, nodeAddr)
	e.mustDocker(t, "rm", "-f", c)
	e.mustDocker(t, "network", "rm", "keep")
	e.assertClean(t)
}

// TestWithCNI: a CNI pod (through libcni, as containerd runs it) and a
// Docker container on the same pool get distinct addresses and reach each
// other.
func TestWithCNI(t *testing.T) {
	e := newEnv(t)
	e.network(t, "mixed")
	ctr := e.run(t, "mixed-a", "--net", "mixed")
	ca := e.addrs(t, ctr, "mixed")

	pod := harness.NewNS(t, "pod")
	list := skeintest.ConfList(t, "cni-mixed", "1.1.0", e.sk.SkeinPlugin(nil))
	rt := skeintest.RT("cni-pod", pod.Path(), "eth0")
	cni := e.sk.CNI()
	if _, err := cni.AddNetworkList(context.Background(), list, rt); err != nil {
		t.Fatalf("CNI ADD: %v", err)
	}
	var pa []netip.Addr
	for _, a := range e.sk.Attachments(t) {
		if a.ContainerId == "cni-pod" {
			for _, s := range a.Addresses {
				pa = append(pa, netip.MustParseAddr(s))
			}
		}
	}
	if len(pa) != 2 || slices.Contains(pa, ca[0]) {
		t.Fatalf("the CNI pod should get its own addresses from the default pool: pod %v, container %v", pa, ca)
	}
	e.ping(t, ctr, pa[0])
	if err := harness.Ping(t, pod, ca[0]); err != nil {
		if err := harness.Ping(t, pod, ca[0]); err != nil {
			t.Errorf("CNI pod should reach the Docker container %s: %v", ca[0], err)
		}
	}
	if err := cni.DelNetworkList(context.Background(), list, rt); err != nil {
		t.Errorf("CNI DEL: %v", err)
	}
	e.mustDocker(t, "rm", "-f", ctr)
	e.mustDocker(t, "network", "rm", "mixed")
	e.assertClean(t)
}

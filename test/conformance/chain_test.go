package conformance

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// Chained plugins run where the runtime runs, in the host's namespace:
// portmap writes iptables rules there, bandwidth puts qdiscs and an ifb
// device on the host side. Here the "host" is the node namespace, so
// every libcni call of these tests runs inside it (plugins inherit the
// namespace of the thread that starts them).

// inNode runs a libcni call inside the node namespace.
func (e *env) inNode(t *testing.T, fn func() error) error {
	t.Helper()
	var callErr error
	if err := e.d.Node.Do(func() error { callErr = fn(); return nil }); err != nil {
		t.Fatalf("enter node: %v", err)
	}
	return callErr
}

func (e *env) chainAdd(t *testing.T, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) *types100.Result {
	t.Helper()
	var res *types100.Result
	err := e.inNode(t, func() error {
		r, err := e.cni.AddNetworkList(cctx(t), l, rt)
		if err == nil {
			res, err = types100.NewResultFromResult(r)
		}
		return err
	})
	if err != nil {
		t.Fatalf("ADD through %s: expected a result, got: %v", names(l), err)
	}
	return res
}

func names(l *libcni.NetworkConfigList) string {
	var s []string
	for _, p := range l.Plugins {
		s = append(s, p.Network.Type)
	}
	return strings.Join(s, "+")
}

// serve listens on port inside ns and answers every connection with a line.
func serve(t *testing.T, ns *harness.NS, port int, line string) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", ns.Name(), err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, line)
			c.Close()
		}
	}()
}

// fetch connects from ns to addr and reads one line.
func fetch(ns *harness.NS, addr string) (string, error) {
	var c net.Conn
	if err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	s, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(s), err
}

// TestChainReferencePlugins: skein followed by the reference portmap,
// bandwidth and tuning plugins (Debian containernetworking-plugins 1.1.1).
// skein's result is their prevResult on ADD; on CHECK and DEL skein gets
// the chain's final result as its prevResult.
func TestChainReferencePlugins(t *testing.T) {
	tool(t, "iptables") // portmap programs iptables
	loadIFBWithoutDevices(t)
	e := newEnv(t)
	portmap := skeintest.Plugin{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}
	bandwidth := skeintest.Plugin{"type": "bandwidth", "ingressRate": 8_000_000, "ingressBurst": 80_000, "egressRate": 8_000_000, "egressBurst": 80_000}
	tuning := skeintest.Plugin{"type": "tuning", "dataDir": t.TempDir(), "sysctl": map[string]string{"net.ipv4.conf.eth0.arp_ignore": "1"}}
	mappings := map[string]any{"portMappings": []map[string]any{{"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"}}}

	t.Run("portmap", func(t *testing.T) {
		l := e.list(t, "chain-pm", refMaxVersion, portmap)
		ns := harness.NewNS(t, "pod")
		rt := skeintest.RT("pm", ns.Path(), "eth0")
		rt.CapabilityArgs = mappings
		serve(t, ns, 8080, "hello from the pod")
		e.chainAdd(t, l, rt)
		hostPort := nodeAddr.String() + ":18080"
		if got, err := fetch(e.d.Node, hostPort); err != nil || got != "hello from the pod" {
			t.Errorf("portmap after skein: node port %s should reach the pod's :8080; got %q, %v", hostPort, got, err)
		}
		e.checkSkeinWithChainResult(t, l, rt)
		if err := e.inNode(t, func() error { return e.cni.DelNetworkList(cctx(t), l, rt) }); err != nil {
			violation(t, "DEL through the chain succeeds", "skein+portmap DEL: %v", err)
		}
		if _, err := fetch(e.d.Node, hostPort); err == nil {
			t.Errorf("after DEL the host port %s still reaches something", hostPort)
		}
		e.assertClean(t, "DEL through skein+portmap")
	})

	t.Run("bandwidth", func(t *testing.T) {
		l := e.list(t, "chain-bw", refMaxVersion, bandwidth)
		ns := harness.NewNS(t, "pod")
		rt := skeintest.RT("bw", ns.Path(), "eth0")
		res := e.chainAdd(t, l, rt)
		node := e.d.Node.Handle(t)
		host, err := node.LinkByName(res.Interfaces[0].Name)
		if err != nil {
			t.Fatalf("host veth %s of the result: %v", res.Interfaces[0].Name, err)
		}
		qd, err := node.QdiscList(host)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, q := range qd {
			kinds = append(kinds, q.Type())
		}
		if !contains(kinds, "tbf") || !contains(kinds, "ingress") {
			t.Errorf("bandwidth after skein should put tbf (ingress rate) and ingress (egress rate) qdiscs on skein's host veth %s; it has %v", host.Attrs().Name, kinds)
		}
		ifb := ifbLinks(t, node)
		if len(ifb) != 1 {
			t.Errorf("bandwidth should add one ifb device in the node for the egress limit, found %v", ifb)
		}
		if err := e.inNode(t, func() error { return e.cni.CheckNetworkList(cctx(t), l, rt) }); err != nil {
			violation(t, "CHECK through the chain succeeds", "skein+bandwidth CHECK: %v", err)
		}
		if err := e.inNode(t, func() error { return e.cni.DelNetworkList(cctx(t), l, rt) }); err != nil {
			violation(t, "DEL through the chain succeeds", "skein+bandwidth DEL: %v", err)
		}
		if left := ifbLinks(t, node); len(left) != 0 {
			t.Errorf("bandwidth DEL should remove its ifb device, left %v", left)
		}
		e.assertClean(t, "DEL through skein+bandwidth")
	})

	t.Run("tuning", func(t *testing.T) {
		l := e.list(t, "chain-tune", refMaxVersion, tuning)
		ns := harness.NewNS(t, "pod")
		rt := skeintest.RT("tune", ns.Path(), "eth0")
		e.chainAdd(t, l, rt)
		if got := sysctl(t, ns, "net/ipv4/conf/eth0/arp_ignore"); got != "1" {
			t.Errorf("tuning after skein should set arp_ignore=1 on skein's eth0, it is %q", got)
		}
		reach(t, ns, "tuned pod", gw4, nodeAddr)
		if err := e.inNode(t, func() error { return e.cni.CheckNetworkList(cctx(t), l, rt) }); err != nil {
			violation(t, "CHECK through the chain succeeds", "skein+tuning CHECK: %v", err)
		}
		if err := e.inNode(t, func() error { return e.cni.DelNetworkList(cctx(t), l, rt) }); err != nil {
			violation(t, "DEL through the chain succeeds", "skein+tuning DEL: %v", err)
		}
		e.assertClean(t, "DEL through skein+tuning")
	})

	t.Run("all three", func(t *testing.T) {
		l := e.list(t, "chain-all", refMaxVersion, portmap, bandwidth, tuning)
		ns := harness.NewNS(t, "pod")
		rt := skeintest.RT("all", ns.Path(), "eth0")
		rt.CapabilityArgs = mappings
		serve(t, ns, 8080, "all three")
		res := e.chainAdd(t, l, rt)
		if len(addrsOf(res, "eth0")) != 2 {
			t.Errorf("the chain's final result should still carry skein's two eth0 addresses: %v", res.IPs)
		}
		if got, err := fetch(e.d.Node, nodeAddr.String()+":18080"); err != nil || got != "all three" {
			t.Errorf("host port through skein+portmap+bandwidth+tuning: got %q, %v", got, err)
		}
		if got := sysctl(t, ns, "net/ipv4/conf/eth0/arp_ignore"); got != "1" {
			t.Errorf("arp_ignore is %q", got)
		}
		e.checkSkeinWithChainResult(t, l, rt)
		if err := e.inNode(t, func() error { return e.cni.DelNetworkList(cctx(t), l, rt) }); err != nil {
			violation(t, "DEL through the chain succeeds", "DEL: %v", err)
		}
		if err := e.inNode(t, func() error { return e.cni.DelNetworkList(cctx(t), l, rt) }); err != nil {
			violation(t, "a second DEL through the chain succeeds", "DEL: %v", err)
		}
		if left := ifbLinks(t, e.d.Node.Handle(t)); len(left) != 0 {
			t.Errorf("ifb devices left: %v", left)
		}
		e.assertClean(t, "DEL through the whole chain")
	})
}

// checkSkeinWithChainResult runs skein's CHECK with the chain's final
// (cached) result as prevResult, as a runtime's CHECK of the whole list
// does. The whole list cannot be CHECKed while portmap is in it: portmap
// 1.1.1's CHECK looks for ip6tables rules it never wrote and fails on its
// own (containernetworking/plugins#819).
func (e *env) checkSkeinWithChainResult(t *testing.T, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	t.Helper()
	prev, err := e.cni.GetNetworkListCachedResult(l, rt)
	if err != nil || prev == nil {
		t.Fatalf("libcni cached result of %s: %v", l.Name, err)
	}
	var prevJSON map[string]any
	b, _ := json.Marshal(prev)
	_ = json.Unmarshal(b, &prevJSON)
	_, serr := e.exec(t, call{cmd: "CHECK", id: rt.ContainerID, netns: rt.NetNS, ifname: rt.IfName,
		conf: map[string]any{"cniVersion": l.CNIVersion, "name": l.Name, "prevResult": prevJSON}})
	if serr != nil {
		violation(t, "CHECK succeeds with the chain's final result as prevResult", "skein CHECK after %s: %v", names(l), serr)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func ifbLinks(t *testing.T, h *netlink.Handle) []string {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Type() == "ifb" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

func sysctl(t *testing.T, ns *harness.NS, path string) string {
	t.Helper()
	var b []byte
	if err := ns.Do(func() error {
		var err error
		b, err = os.ReadFile("/proc/sys/" + path)
		return err
	}); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// loadIFBWithoutDevices loads the ifb module before the bandwidth plugin
// makes the kernel auto-load it: loaded that way it creates ifb0 and ifb1
// in the host's namespace, and the tests must leave the host's network as
// they found it. With numifbs=0 it creates none.
func loadIFBWithoutDevices(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/sys/module/ifb"); err == nil {
		return
	}
	if out, err := exec.Command("modprobe", "ifb", "numifbs=0").CombinedOutput(); err != nil {
		t.Logf("modprobe ifb numifbs=0: %v: %s (the kernel may create ifb0/ifb1 on the host)", err, out)
	}
}

package e2e

import (
	"context"
	"slices"
	"testing"

	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// TestDelEdgeCases: the spec wants DEL to succeed whenever what it would
// remove is already (partly) gone, and to release everything it can.
func TestDelEdgeCases(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	l := e.list(t, "del", "1.1.0", nil)

	t.Run("pod netns deleted first", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		p := e.mustAdd(t, l, ns, "gone-ns")
		host := p.res.Interfaces[0].Name
		if err := netns.Remove(ns.Path()); err != nil {
			t.Fatal(err)
		}
		if err := e.del(t, l, p.rt); err != nil {
			t.Fatalf("DEL after the pod's netns was deleted: the spec expects success, got: %v", err)
		}
		if slices.Contains(hostLinks(t, e.d.Node), host) {
			t.Errorf("DEL must remove host veth %s even when the pod netns is gone", host)
		}
		// The addresses are free again: a new pod may ask for exactly them.
		ns2 := harness.NewNS(t, "pod")
		rt := skeintest.RT("reuse", ns2.Path(), "eth0")
		rt.Args = [][2]string{{"IP", p.addrs[0].String() + "," + p.addrs[1].String()}}
		if _, err := e.add(t, l, rt); err != nil {
			t.Errorf("DEL should have released %v; asking for them again failed: %v", p.addrs, err)
		}
		e.mustDel(t, l, rt)
		e.assertNothingLeft(t)
	})

	t.Run("never added", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		if err := e.del(t, l, skeintest.RT("never-added", ns.Path(), "eth0")); err != nil {
			t.Errorf("DEL of an attachment that never existed: the spec expects success, got: %v", err)
		}
		// Runtimes may leave CNI_NETNS empty on DEL.
		v := e.rawVars("DEL", "never-added", "", "eth0")
		delete(v, "CNI_NETNS")
		if _, _, err := e.rawCNI(t, v, e.rawConf(t, "del", "1.1.0", nil)); err != nil {
			t.Errorf("DEL without CNI_NETNS of an attachment that never existed: expected success, got: %v", err)
		}
		e.assertNothingLeft(t)
	})

	t.Run("no prevResult and no CNI_NETNS", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		e.mustAdd(t, l, ns, "no-prev")
		// Straight to the binary: libcni would add the cached result.
		if _, _, err := e.rawCNI(t, e.rawVars("DEL", "no-prev", ns.Path(), "eth0"), e.rawConf(t, "del", "1.1.0", nil)); err != nil {
			t.Errorf("DEL without prevResult: the spec expects success, got: %v", err)
		}
		e.assertNothingLeft(t)

		e.mustAdd(t, l, ns, "no-netns")
		v := e.rawVars("DEL", "no-netns", "", "eth0")
		delete(v, "CNI_NETNS")
		if _, _, err := e.rawCNI(t, v, e.rawConf(t, "del", "1.1.0", nil)); err != nil {
			t.Errorf("DEL without CNI_NETNS: expected success, got: %v", err)
		}
		e.assertNothingLeft(t)
	})

	// A DEL that finds the kernel link but no record cannot be produced
	// through the API while skeind runs; the way to it is losing the record
	// while skeind is down. Then the restart itself removes the orphan link
	// (it carries skein's tag but nothing claims it) and DEL still succeeds.
	t.Run("record lost while skeind was down", func(t *testing.T) {
		ns := harness.NewNS(t, "pod")
		p := e.mustAdd(t, l, ns, "lost-record")
		e.d.Stop(t)
		st := e.d.OpenStore(t)
		err := st.DeleteAttachment(context.Background(), store.AttachmentKey{Network: "del", ContainerID: "lost-record", IfName: "eth0"})
		st.Close()
		if err != nil {
			t.Fatalf("delete record: %v", err)
		}
		e.d.Start(t)
		if links := hostLinks(t, e.d.Node); len(links) != 0 {
			t.Errorf("on restart skeind should remove tagged links no record claims; left %v", links)
		}
		if err := e.del(t, l, p.rt); err != nil {
			t.Errorf("DEL of an attachment whose record was lost: expected success, got: %v", err)
		}
		e.assertNothingLeft(t)
	})
}

// TestDelOfFailedAddLeavesOtherNetworkAlone: an ADD on network B that fails
// because the pod's eth0 already belongs to network A, then the runtime's
// DEL for network B: A's interface, record and addresses must survive.
func TestDelOfFailedAddLeavesOtherNetworkAlone(t *testing.T) {
	e := newEnv(t, skeintest.Options{})
	la := e.list(t, "neta", "1.1.0", nil)
	lb := e.list(t, "netb", "1.1.0", nil)
	pod := harness.NewNS(t, "pod")
	peer := e.mustAdd(t, la, harness.NewNS(t, "peer"), "peer")
	a := e.mustAdd(t, la, pod, "shared")
	rt := skeintest.RT("shared", pod.Path(), "eth0")
	_, err := e.add(t, lb, rt)
	wantCode(t, "ADD on network B when eth0 belongs to network A", err, 4)
	if err := e.del(t, lb, rt); err != nil {
		t.Fatalf("DEL on network B: the spec expects success, got %v", err)
	}
	mustReach(t, a.ns, "network A's peer after network B's DEL", peer.addr(false), peer.addr(true))
	if err := e.check(t, la, a.rt); err != nil {
		t.Errorf("CHECK of network A after network B's DEL: %v", err)
	}
	e.mustDel(t, la, a.rt)
	e.mustDel(t, la, peer.rt)
}

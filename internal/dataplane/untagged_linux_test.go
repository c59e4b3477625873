package dataplane_test

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/skeinnet/skein/internal/dataplane"
)

// An ADD cut short between creating the host veth and tagging it leaves an
// untagged veth named like skein's: Scan must report it, Teardown delete it
// and Retag tag it. An untagged veth with any other name is not skein's.
func TestUntaggedHostLinks(t *testing.T) {
	node, dp := newNode(t, dataplane.Config{})
	h := node.Handle(t)
	add := func(name string) {
		t.Helper()
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
	}
	add("sk0123456789ab")
	add("sk0123456789cd")
	add("skforeign")

	found, err := dp.Scan()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range found {
		names[f.HostName] = true
	}
	if !names["sk0123456789ab"] || !names["sk0123456789cd"] || names["skforeign"] || len(found) != 2 {
		t.Fatalf("Scan found %v, want exactly the two untagged sk<12 hex> veths", names)
	}

	if err := dp.Teardown("skforeign", "", "", nil); !errors.Is(err, dataplane.ErrNotOwned) {
		t.Errorf("Teardown(foreign untagged veth) = %v, want ErrNotOwned", err)
	}
	if err := dp.Teardown("sk0123456789ab", "", "", nil); err != nil {
		t.Errorf("Teardown(untagged skein-named veth) = %v, want nil", err)
	}
	if _, err := h.LinkByName("sk0123456789ab"); err == nil {
		t.Error("untagged skein-named veth still there after Teardown")
	}

	if err := dp.Retag("sk0123456789cd", "skein:n:c:eth0"); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("sk0123456789cd")
	if err != nil || l.Attrs().Alias != "skein:n:c:eth0" {
		t.Errorf("after Retag: %v, alias %q", err, l.Attrs().Alias)
	}
	if err := dp.Retag("skforeign", "skein:x"); !errors.Is(err, dataplane.ErrNotOwned) {
		t.Errorf("Retag(foreign) = %v, want ErrNotOwned", err)
	}
}

func TestIsHostName(t *testing.T) {
	for name, want := range map[string]bool{
		"sk0123456789ab": true, "sk0123456789AB": false, "sk0123456789a": false,
		"xk0123456789ab": false, "sk0123456789abc": false, "sk01234567890g": false,
	} {
		if got := dataplane.IsHostName(name); got != want {
			t.Errorf("IsHostName(%q) = %v, want %v", name, got, want)
		}
	}
}

// Links that are not veths are never pod links, whatever their alias: the
// routing VXLAN device carries "skein:routing:vxlan", under the pod alias
// prefix, and a skeind restart (reconcile: Scan, then Teardown of every
// unclaimed link) once deleted it as a leftover.
func TestNonVethWithSkeinAliasNotOwned(t *testing.T) {
	node, dp := newNode(t, dataplane.Config{})
	h := node.Handle(t)
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "skein.vxlan"}, VxlanId: 4100, Port: 4789}
	if err := h.LinkAdd(vx); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("skein.vxlan")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetAlias(l, "skein:routing:vxlan"); err != nil {
		t.Fatal(err)
	}
	found, err := dp.Scan()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		if f.HostName == "skein.vxlan" {
			t.Errorf("Scan reports the VXLAN device as a pod link: %+v", f)
		}
	}
	if err := dp.Teardown("skein.vxlan", "", "", nil); !errors.Is(err, dataplane.ErrNotOwned) {
		t.Errorf("Teardown(skein.vxlan) = %v, want ErrNotOwned", err)
	}
	if err := dp.Retag("skein.vxlan", "skein:n:c:eth0"); !errors.Is(err, dataplane.ErrNotOwned) {
		t.Errorf("Retag(skein.vxlan) = %v, want ErrNotOwned", err)
	}
	after, err := h.LinkByName("skein.vxlan")
	if err != nil {
		t.Fatalf("VXLAN device gone after Scan/Teardown/Retag: %v", err)
	}
	if a := after.Attrs(); a.Index != l.Attrs().Index || a.Alias != "skein:routing:vxlan" {
		t.Errorf("VXLAN device after Scan/Teardown/Retag: index %d alias %q, was %d %q", a.Index, a.Alias, l.Attrs().Index, "skein:routing:vxlan")
	}
}

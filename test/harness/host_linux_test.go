package harness_test

import (
	"strings"
	"testing"

	"github.com/skeinnet/skein/test/harness"
)

func TestNetNSDirMount(t *testing.T) {
	for _, c := range []struct {
		mount string
		want  bool
	}{
		{"/run/netns type=ext4 source=/dev/vda root=/run/netns", true}, // /run part of /
		{"/run/netns type=tmpfs source=tmpfs root=/netns", true},       // /run a tmpfs
		{"/run/netns type=tmpfs source=tmpfs root=/", false},           // a tmpfs of its own
		{"/run/netns/x type=ext4 source=/dev/vda root=/run/netns", false},
		{"/run type=tmpfs source=tmpfs root=/", false},
		{"/mnt type=ext4 source=/dev/vda root=/run/netns", false},
	} {
		if got := harness.NetNSDirMount(c.mount); got != c.want {
			t.Errorf("NetNSDirMount(%q) = %t, want %t", c.mount, got, c.want)
		}
	}
}

func TestCompareHost(t *testing.T) {
	before := harness.Host{
		Net:    harness.State{Links: []string{"eth0", "lo"}, Routes: []string{"table 119 x"}},
		NFT:    []string{"table inet a {"},
		Mounts: []string{"/ type=ext4"},
		NetNS:  []string{"name /run/netns/a"},
	}
	after := before
	after.Net.Routes = nil // table 119 is compared like any other
	after.NFT = []string{"table inet a {", "table inet b {"}
	after.Mounts = []string{"/ type=ext4", "/tmp/x type=overlay"}
	after.NetNS = nil
	net := harness.CompareHost(before, after, false)
	all := harness.CompareHost(before, after, true)
	if len(net) != 2 || net[0].What != "routes" || net[1].What != "nftables" {
		t.Errorf("network diffs: %v", net)
	}
	if len(all) != 4 || all[2].What != "namespaces" || all[3].What != "mounts" {
		t.Errorf("all diffs: %v", all)
	}
	if s := all[0].String(); !strings.Contains(s, "gone:  table 119 x") {
		t.Errorf("diff text %q should name what is gone", s)
	}
	if d := harness.CompareHost(before, before, true); len(d) != 0 {
		t.Errorf("a host compared with itself differs: %v", d)
	}
}

// TestReadHost reads the real host (read-only) twice: the two pictures
// are alike and hold at least lo.
func TestReadHost(t *testing.T) {
	harness.RequireRoot(t)
	a, err := harness.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Net.Links) == 0 || len(a.Mounts) == 0 {
		t.Fatalf("host picture without links or mounts: %+v", a)
	}
	found := false
	for _, l := range a.Net.Links {
		found = found || strings.HasPrefix(l, "lo ")
	}
	if !found {
		t.Errorf("the host's links should include lo: %v", a.Net.Links)
	}
	b, err := harness.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	if d := harness.CompareHost(a, b, false); len(d) != 0 {
		t.Errorf("two reads of an untouched host network differ: %v", d)
	}
}

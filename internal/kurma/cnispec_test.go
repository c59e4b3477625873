package kurma

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/kurma/image"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
)

// TestCNISpec: a pack-cni image's plugin is called directly with CNI's
// environment (the image's own CNI_* variables dropped), on DEL with the
// recorded ADD result as prevResult in the config's version (0.4.0 and
// later only), without CNI_NETNS when the namespace is gone; a type the
// image does not pack is refused.
func TestCNISpec(t *testing.T) {
	img := image.Image{Root: "/img", CNIPlugins: []string{"ptp", "host-local"},
		Env: []string{"PATH=/bin", "CNI_PATH=/evil", "GOMAXPROCS=1"}}
	rec := &PodRecord{ID: "pod1", NetNS: "/run/netns/p1"}
	result := json.RawMessage(`{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.1.0.5/24","interface":0}]}`)
	a := AttachmentRecord{Network: "n", IfName: "eth0", Result: result,
		Config: json.RawMessage(`{"cniVersion":"1.0.0","name":"n","type":"ptp"}`)}

	add, err := cniSpec(sandbox.OpAdd, rec, a, img, "/state", false)
	if err != nil {
		t.Fatal(err)
	}
	if add.Path != "/opt/cni/bin/ptp" || string(add.Stdin) != string(a.Config) || add.NetNS != rec.NetNS || add.StateDir != "/state" {
		t.Errorf("ADD spec: %+v", add)
	}
	for _, want := range []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=pod1", "CNI_NETNS=/run/netns/p1", "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin", "GOMAXPROCS=1"} {
		if !slices.Contains(add.Env, want) {
			t.Errorf("ADD env %q lacks %q", add.Env, want)
		}
	}
	if slices.Contains(add.Env, "CNI_PATH=/evil") {
		t.Errorf("the image's own CNI_PATH reached the plugin: %q", add.Env)
	}

	del, err := cniSpec(sandbox.OpDel, rec, a, img, "/state", false)
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Prev struct {
			CNIVersion string `json:"cniVersion"`
			IPs        []any  `json:"ips"`
		} `json:"prevResult"`
	}
	if err := json.Unmarshal(del.Stdin, &conf); err != nil || conf.Prev.CNIVersion != "1.0.0" || len(conf.Prev.IPs) != 1 {
		t.Errorf("DEL stdin should carry the ADD result as a 1.0.0 prevResult: %s (%v)", del.Stdin, err)
	}
	if !slices.Contains(del.Env, "CNI_COMMAND=DEL") {
		t.Errorf("DEL env %q", del.Env)
	}

	old := a
	old.Config = json.RawMessage(`{"cniVersion":"0.3.1","name":"n","type":"ptp"}`)
	if s, err := cniSpec(sandbox.OpDel, rec, old, img, "/state", false); err != nil || strings.Contains(string(s.Stdin), "prevResult") {
		t.Errorf("a 0.3.1 DEL gets no prevResult: %s %v", s.Stdin, err)
	}

	gone, err := cniSpec(sandbox.OpDel, rec, a, img, "/state", true)
	if err != nil || !slices.Contains(gone.Env, "CNI_NETNS=") {
		t.Errorf("DEL with the namespace gone: CNI_NETNS must be empty: %q %v", gone.Env, err)
	}

	bad := a
	bad.Config = json.RawMessage(`{"cniVersion":"1.0.0","name":"n","type":"../../bin/sh"}`)
	if _, err := cniSpec(sandbox.OpAdd, rec, bad, img, "/state", false); err == nil || !strings.Contains(err.Error(), "not one of those its image packs") {
		t.Errorf("a type the image does not pack: %v", err)
	}
}

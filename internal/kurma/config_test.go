package kurma

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParseNetworks(t *testing.T) {
	raw := `[
	  {"name":"pods","type":"skein","pool":"p1","default":true,"containerInterface":"eth0"},
	  {"name":"br","aci":"file:///var/lib/img.tar","containerInterface":"net{{num}}","type":"bridge","bridge":"br9","timeout":"5s","optional":true,"ipam":{"type":"host-local"}},
	  {"name":"mv","image":"docker://127.0.0.1:5000/mv@` + testDigest + `","type":"macvlan","timeout":2.5}
	]`
	nets, err := ParseNetworks(json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(nets) != 3 {
		t.Fatalf("got %d networks", len(nets))
	}
	if n := nets[0]; !n.Builtin() || n.Pool != "p1" || !n.Default || n.Timeout != DefaultTimeout {
		t.Errorf("skein network: %+v", n)
	}
	if n := nets[1]; n.Builtin() || n.Image != "file:///var/lib/img.tar" || !n.Optional || n.Timeout != 5*time.Second || n.Type != "bridge" {
		t.Errorf("aci alias network: %+v", n)
	}
	// Everything travels to the plugin, Kurma's own keys included.
	var back map[string]any
	if err := json.Unmarshal(nets[1].Raw, &back); err != nil || back["bridge"] != "br9" || back["aci"] == nil || back["ipam"] == nil {
		t.Errorf("raw entry lost keys: %s", nets[1].Raw)
	}
	if nets[2].Timeout != 2500*time.Millisecond {
		t.Errorf("numeric timeout: %v", nets[2].Timeout)
	}
	if got := Defaults(nets); len(got) != 1 || got[0] != "pods" {
		t.Errorf("defaults %v", got)
	}
}

func TestParseNetworksErrors(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{`{"name":"x"}`, "want a list"},
		{`[{"name":"","type":"skein","containerInterface":"eth0"}]`, "network name"},
		{`[{"name":"a/b","type":"skein","containerInterface":"eth0"}]`, "network name"},
		{`[{"name":"a","type":"bridge"}]`, "no image"},
		{`[{"name":"a","type":"skein"}]`, "needs a containerInterface"},
		{`[{"name":"a","type":"skein","containerInterface":"eth0"},{"name":"a","type":"skein","containerInterface":"eth1"}]`, "defined twice"},
		{`[{"name":"a","image":"ftp://x","type":"bridge"}]`, "image"},
		{`[{"name":"a","image":"docker://127.0.0.1:5000/x:latest","type":"bridge"}]`, "image"},
		{`[{"name":"a","image":"https://example.com/x.tar","type":"bridge"}]`, "image"},
		{`[{"name":"a","image":"file:///x","aci":"file:///y","type":"bridge"}]`, "alias"},
		{`[{"name":"a","image":"file:///x","type":"bridge","containerInterface":"eth{{"}]`, "containerInterface"},
		{`[{"name":"a","image":"file:///x","type":"bridge","containerInterface":"{{nosuch}}"}]`, "containerInterface"},
		{`[{"name":"a","image":"file:///x","type":"bridge","containerInterface":"averyveryverylongname{{num}}"}]`, "longer than"},
		{`[{"name":"a","image":"file:///x","type":"bridge","timeout":"soon"}]`, "timeout"},
		{`[{"name":"a","image":"file:///x","type":"bridge","timeout":-1}]`, "timeout"},
		{`[{"name":"a","image":"file:///x","type":"bridge","optional":"yes"}]`, "decode"},
		{`[42]`, "decode"},
	} {
		_, err := ParseNetworks(json.RawMessage(c.raw))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want it to mention %q", c.raw, err, c.want)
		}
	}
}

func TestRenderIfName(t *testing.T) {
	uuid := "146d7cef-fbf6-41da-a2f8-eba218597f9c"
	for _, c := range []struct {
		tmpl  string
		num   int
		taken []string
		want  string // "" with errWant
		err   string
	}{
		{tmpl: "", want: ""},
		{tmpl: "eth0", want: "eth0"},
		{tmpl: "net{{num}}", num: 2, want: "net2"},
		{tmpl: "k{{shortuuid}}", want: "k146d7cef"},
		{tmpl: "eth0", taken: []string{"eth0"}, err: "already exists"},
		{tmpl: "{{uuid}}", err: "longer than"},
		{tmpl: "{{random 0}}", err: "random 0"},
		{tmpl: "net%d", err: "'%'"},
		{tmpl: "n{{printf \"%c\" 1}}", err: "control character"},
	} {
		taken := map[string]bool{}
		for _, n := range c.taken {
			taken[n] = true
		}
		got, err := RenderIfName(c.tmpl, uuid, c.num, taken)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: err %v, want %q", c.tmpl, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: got %q, %v; want %q", c.tmpl, got, err, c.want)
		}
	}
	// random retries around taken names: all but one of the 16 names of
	// "random 1" taken, it still finds the free one (almost always: 16
	// draws miss it with probability (15/16)^16, about 36%, so a few tries).
	taken := map[string]bool{}
	for _, c := range "0123456789abcde" {
		taken["r"+string(c)] = true
	}
	found := false
	for range 20 {
		if n, err := RenderIfName("r{{random 1}}", uuid, 0, taken); err == nil {
			if n != "rf" {
				t.Fatalf("rendered %q, a taken name", n)
			}
			found = true
			break
		}
	}
	if !found {
		t.Error("random never found the one free name")
	}
	taken["rf"] = true
	if _, err := RenderIfName("r{{random 1}}", uuid, 0, taken); err == nil || !strings.Contains(err.Error(), "no free name") {
		t.Errorf("all names taken: err %v", err)
	}
}

func TestParseSelection(t *testing.T) {
	s, err := ParseSelection("br@net1")
	if err != nil || s.Network != "br" || s.IfName != "net1" {
		t.Errorf("got %+v, %v", s, err)
	}
	for _, bad := range []string{"", "@eth0", "br@", "br@a/b", "br@0123456789abcdef", "br@net%d", "br@a\x01", "br@a\x7f", "br@a\x00"} {
		if _, err := ParseSelection(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestAllowList(t *testing.T) {
	parse := func(js string) (Network, error) { return ParseNetwork(json.RawMessage(js)) }
	base := `"name":"blue","type":"skein","pool":"blue","containerInterface":"net1"`
	cases := []struct {
		entry  string
		ns     string
		labels map[string]string
		want   bool
	}{
		// No allow-list: only a default network is open to every namespace.
		{`{` + base + `}`, "default", nil, false},
		{`{` + base + `,"default":true}`, "team-a", nil, true},
		{`{` + base + `,"allowedNamespaces":["team-a"]}`, "team-a", nil, true},
		{`{` + base + `,"allowedNamespaces":["team-a"]}`, "team-b", nil, false},
		// A default network with an allow-list is restricted too.
		{`{` + base + `,"default":true,"allowedNamespaces":["team-a"]}`, "team-b", nil, false},
		{`{` + base + `,"namespaceSelector":{"matchLabels":{"team":"blue"}}}`, "x", map[string]string{"team": "blue", "env": "prod"}, true},
		{`{` + base + `,"namespaceSelector":{"matchLabels":{"team":"blue"}}}`, "x", map[string]string{"team": "red"}, false},
		{`{` + base + `,"namespaceSelector":{"matchLabels":{"team":"blue"}}}`, "x", nil, false},
		{`{` + base + `,"namespaceSelector":{}}`, "anything", nil, true},
		{`{` + base + `,"allowedNamespaces":["a"],"namespaceSelector":{"matchLabels":{"t":"1"}}}`, "b", map[string]string{"t": "1"}, true},
	}
	for _, c := range cases {
		n, err := parse(c.entry)
		if err != nil {
			t.Fatalf("%s: %v", c.entry, err)
		}
		if got := n.Admits(c.ns, c.labels); got != c.want {
			t.Errorf("%s: Admits(%q, %v) = %v, want %v", c.entry, c.ns, c.labels, got, c.want)
		}
	}
	for _, bad := range []string{
		`{` + base + `,"allowedNamespaces":"team-a"}`,
		`{` + base + `,"allowedNamespaces":["Team_A"]}`,
		`{` + base + `,"allowedNamespaces":[""]}`,
		// matchExpressions would be dropped silently: refused.
		`{` + base + `,"namespaceSelector":{"matchExpressions":[{"key":"team","operator":"In","values":["blue"]}]}}`,
		`{` + base + `,"namespaceSelector":{"matchLabels":{"":"x"}}}`,
		`{` + base + `,"namespaceSelector":["team"]}`,
		// null decoded as {} and admitted every namespace.
		`{` + base + `,"allowedNamespaces":["team-blue"],"namespaceSelector":null}`,
		`{` + base + `,"namespaceSelector": null }`,
	} {
		if _, err := parse(bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

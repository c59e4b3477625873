package daemon

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParsePodNetworksKeys(t *testing.T) {
	entry := json.RawMessage(`[{"name":"p","type":"skein","containerInterface":"eth0"}]`)
	for _, c := range []struct {
		name string
		cfg  Config
		n    int
		err  string
	}{
		{"none", Config{}, 0, ""},
		{"podNetworks", Config{PodNetworks: entry}, 1, ""},
		{"pod_networks", Config{PodNetworksAlias: entry}, 1, ""},
		{"both", Config{PodNetworks: entry, PodNetworksAlias: entry}, 0, "both podNetworks and pod_networks"},
		{"invalid", Config{PodNetworks: json.RawMessage(`[{"name":"p","type":"bridge"}]`)}, 0, "no image"},
	} {
		nets, err := ParsePodNetworks(c.cfg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || len(nets) != c.n {
			t.Errorf("%s: %d networks, %v; want %d", c.name, len(nets), err, c.n)
		}
	}
}

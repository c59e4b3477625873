package router

import (
	"os"
	"strings"
	"testing"

	"github.com/skeinnet/skein/test/harness"
)

func readSysctls(t *testing.T, keys []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range keys {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = strings.TrimSpace(string(b))
	}
	return out
}

// EnableForwarding sets the router's sysctls in the namespace it is
// given, and only there.
func TestEnableForwarding(t *testing.T) {
	ns := harness.NewNS(t, "egsysctl")
	want := routerSysctls(true, true)
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	host := readSysctls(t, keys)
	if err := EnableForwarding(ns.Path(), true, true); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := ns.Do(func() error { got = readSysctls(t, keys); return nil }); err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %s in the namespace, want %s", k, got[k], v)
		}
	}
	if after := readSysctls(t, keys); len(after) != len(host) {
		t.Fatal("read the host's sysctls")
	} else {
		for k, v := range host {
			if after[k] != v {
				t.Errorf("the host's %s changed from %s to %s", k, v, after[k])
			}
		}
	}
	// Again: nothing to write, no error.
	if err := EnableForwarding(ns.Path(), true, true); err != nil {
		t.Errorf("second call: %v", err)
	}
	if m := routerSysctls(true, false); m["net/ipv6/conf/all/forwarding"] != "" {
		t.Errorf("IPv4-only router touches IPv6 forwarding: %v", m)
	}
}

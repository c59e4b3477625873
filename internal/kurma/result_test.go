package kurma

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestConvertResult(t *testing.T) {
	for _, c := range []struct {
		name, out, confVer string
		ips                int
		ifaces             int
	}{
		{"kurma 0.2 without version", `{"ip4":{"ip":"10.1.0.5/24","gateway":"10.1.0.1"},"ip6":{"ip":"fd00::5/64"}}`, "", 2, 1},
		{"0.2.0 named", `{"cniVersion":"0.2.0","ip4":{"ip":"10.1.0.5/24"}}`, "", 1, 1},
		{"0.3.1", `{"cniVersion":"0.3.1","interfaces":[{"name":"eth1","sandbox":"/run/netns/x"}],"ips":[{"version":"4","address":"10.1.0.5/24","interface":0}]}`, "", 1, 1},
		{"1.1.0 without interfaces", `{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5/24"}]}`, "", 1, 1},
		{"conf version used", `{"ips":[{"address":"10.1.0.5/24"}]}`, "1.0.0", 1, 1},
	} {
		r, err := ConvertResult([]byte(c.out), c.confVer, "eth1", "/run/netns/x")
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if r.CNIVersion != ResultVersion || len(r.IPs) != c.ips || len(r.Interfaces) != c.ifaces {
			b, _ := json.Marshal(r)
			t.Errorf("%s: got %s", c.name, b)
			continue
		}
		if r.Interfaces[0].Name != "eth1" || r.IPs[0].Interface == nil || *r.IPs[0].Interface != 0 {
			b, _ := json.Marshal(r)
			t.Errorf("%s: interface not filled in: %s", c.name, b)
		}
	}
	for _, bad := range []string{"", "garbage", `{"cniVersion":"9.9.9"}`, `{"ip4":{"ip":"nope"}}`, `[1]`} {
		if _, err := ConvertResult([]byte(bad), "", "eth1", "/x"); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	if _, err := ConvertResult([]byte("log line\n{}"), "", "eth1", "/x"); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("log line before result: %v", err)
	}
}

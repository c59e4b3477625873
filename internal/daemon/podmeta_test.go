package daemon

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/internal/kurma"
)

func TestReadMeta(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		on         bool
		ann        map[string]string
		code       uint
	}{
		{"plain skein", `{"type":"skein","pool":"a"}`, false, nil, 0},
		{"meta", `{"type":"skein","podNetworks":true}`, true, nil, 0},
		{"kurma spelling", `{"type":"skein","pod_networks":true}`, true, nil, 0},
		{"false", `{"type":"skein","podNetworks":false}`, false, nil, 0},
		{"a list is not for CNI", `{"type":"skein","podNetworks":[{"name":"x"}]}`, false, nil, types.ErrInvalidNetworkConfig},
		{"annotations", `{"podNetworks":true,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"skein.dev/networks":"a,b","x":"y"}}}`,
			true, map[string]string{"skein.dev/networks": "a,b", "x": "y"}, 0},
		{"bad annotations", `{"podNetworks":true,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":[1]}}`, false, nil, types.ErrDecodingFailure},
		{"not json: left to cni.Parse", `{`, false, nil, 0},
		{"an escaped key is still the key", `{"type":"skein","pod\u004eetworks":true}`, true, nil, 0},
		{"the word elsewhere", `{"type":"skein","note":"podNetworks are off"}`, false, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, on, err := readMeta([]byte(tc.conf))
			if code := errCode(err); code != tc.code {
				t.Fatalf("err %v, want code %d", err, tc.code)
			}
			if on != tc.on || !reflect.DeepEqual(m.Annotations, tc.ann) {
				t.Errorf("got %v %v", on, m.Annotations)
			}
		})
	}
}

func errCode(err error) uint {
	if err == nil {
		return 0
	}
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 999
}

func sel(n, i string) kurma.Selection { return kurma.Selection{Network: n, IfName: i} }

func TestPodSelections(t *testing.T) {
	ann := func(v string) metaConf { return metaConf{Annotations: map[string]string{NetworksAnnotation: v}} }
	for _, tc := range []struct {
		name     string
		m        metaConf
		args     string
		defaults []string
		want     []kurma.Selection
		code     uint
		msg      string
	}{
		{"annotation", ann("a, b@net1,c"), "SKEIN_NETWORKS=x", []string{"d"}, []kurma.Selection{sel("a", "eth0"), sel("b", "net1"), sel("c", "")}, 0, ""},
		{"annotation JSON", ann(`["a", {"name":"b","interface":"net2"}, {"name":"c"}]`), "", nil, []kurma.Selection{sel("a", "eth0"), sel("b", "net2"), sel("c", "")}, 0, ""},
		{"annotation first names eth0", ann("a@eth0,b"), "", nil, []kurma.Selection{sel("a", "eth0"), sel("b", "")}, 0, ""},
		{"CNI_ARGS", metaConf{}, "IgnoreUnknown=1;K8S_POD_NAME=p;SKEIN_NETWORKS=a@eth1,b", nil, nil, types.ErrInvalidNetworkConfig, "takes the runtime's interface eth0"},
		{"CNI_ARGS ok", metaConf{}, "IgnoreUnknown=1;SKEIN_NETWORKS=a,b@eth1", nil, []kurma.Selection{sel("a", "eth0"), sel("b", "eth1")}, 0, ""},
		{"empty annotation falls through", ann(" "), "SKEIN_NETWORKS=b", nil, []kurma.Selection{sel("b", "eth0")}, 0, ""},
		{"defaults", metaConf{}, "", []string{"d1", "d2"}, []kurma.Selection{sel("d1", "eth0"), sel("d2", "")}, 0, ""},
		{"nothing at all", metaConf{}, "", nil, nil, types.ErrInvalidNetworkConfig, "no default pod network"},
		{"bad name", ann("a,b c"), "", nil, nil, types.ErrInvalidNetworkConfig, "annotation skein.dev/networks"},
		{"empty item", ann("a,,b"), "", nil, nil, types.ErrInvalidNetworkConfig, "not a valid network name"},
		{"bad ifname", ann("a,b@this-name-is-far-too-long"), "", nil, nil, types.ErrInvalidNetworkConfig, "b@"},
		{"bad JSON", ann(`[{"name":"a","iface":"x"}]`), "", nil, nil, types.ErrInvalidNetworkConfig, "unknown field"},
		// A tenant's "[]" crashed skeind (an index into an empty list), on
		// the ADD and again on every retry and DEL.
		{"empty JSON list", ann(`[]`), "", []string{"d"}, nil, types.ErrInvalidNetworkConfig, "an empty list of networks"},
		{"empty JSON list, spaced", ann(" [ ] "), "", nil, nil, types.ErrInvalidNetworkConfig, "an empty list of networks"},
		{"JSON in CNI_ARGS", metaConf{}, `SKEIN_NETWORKS=["a"]`, nil, nil, types.ErrInvalidEnvironmentVariables, "JSON only in the annotation"},
		{"bad CNI_ARGS", metaConf{}, "garbage", nil, nil, types.ErrInvalidEnvironmentVariables, "KEY=VALUE"},
		{"bad name in CNI_ARGS", metaConf{}, "SKEIN_NETWORKS=a/b", nil, nil, types.ErrInvalidEnvironmentVariables, "CNI_ARGS SKEIN_NETWORKS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := podSelections(tc.m, tc.args, "eth0", tc.defaults)
			if code := errCode(err); code != tc.code || (err != nil && !strings.Contains(err.Error(), tc.msg)) {
				t.Fatalf("err %v, want code %d with %q", err, tc.code, tc.msg)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMergeResults: interfaces concatenated, address indices shifted to
// the joined list, routes kept, DNS from the first network with any,
// attachments not attached left out.
func TestMergeResults(t *testing.T) {
	atts := []kurma.AttachmentRecord{
		{Network: "a", IfName: "eth0", State: kurma.StateAttached, Result: json.RawMessage(`{"cniVersion":"1.1.0",
			"interfaces":[{"name":"veth1"},{"name":"eth0","sandbox":"/run/netns/p"}],
			"ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1","interface":1}],
			"routes":[{"dst":"0.0.0.0/0"}]}`)},
		{Network: "x", IfName: "net9", State: kurma.StateAdding},
		{Network: "b", IfName: "net1", State: kurma.StateAttached, Result: json.RawMessage(`{"cniVersion":"1.1.0",
			"interfaces":[{"name":"br0"},{"name":"net1","sandbox":"/run/netns/p"}],
			"ips":[{"address":"10.1.0.2/24","interface":1},{"address":"fd00::2/64","interface":1}],
			"dns":{"nameservers":["10.1.0.1"]}}`)},
		{Network: "c", IfName: "net2", State: kurma.StateAttached, Result: json.RawMessage(`{"cniVersion":"1.1.0","dns":{"nameservers":["9.9.9.9"]}}`)},
	}
	r, err := mergeResults(atts, "/run/netns/p")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range r.Interfaces {
		names = append(names, i.Name+"@"+i.Sandbox)
	}
	if want := []string{"veth1@", "eth0@/run/netns/p", "br0@", "net1@/run/netns/p", "net2@/run/netns/p"}; !reflect.DeepEqual(names, want) {
		t.Errorf("interfaces %v, want %v", names, want)
	}
	var ips []string
	for _, ip := range r.IPs {
		ips = append(ips, ip.Address.String()+"→"+r.Interfaces[*ip.Interface].Name)
	}
	if want := []string{"10.0.0.2/24→eth0", "10.1.0.2/24→net1", "fd00::2/64→net1"}; !reflect.DeepEqual(ips, want) {
		t.Errorf("ips %v, want %v", ips, want)
	}
	if len(r.Routes) != 1 || !reflect.DeepEqual(r.DNS.Nameservers, []string{"10.1.0.1"}) {
		t.Errorf("routes %v dns %v", r.Routes, r.DNS)
	}
	if _, err := mergeResults([]kurma.AttachmentRecord{{Network: "a", State: kurma.StateAttached, Result: json.RawMessage(`{`)}}, ""); err == nil {
		t.Error("an undecodable result was merged")
	}
}

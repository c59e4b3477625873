package kubestore_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/docker"
)

// noPlumber: the Docker IPAM calls tested here plumb nothing.
type noPlumber struct{}

func (noPlumber) SetupPair(dataplane.Pair) (dataplane.Applied, error) {
	return dataplane.Applied{}, nil
}
func (noPlumber) Teardown(string, string, string, []netip.Addr) error { return nil }
func (noPlumber) Config() dataplane.Config                            { return dataplane.Config{AliasPrefix: "skein:"} }

// dockerIPAM drives the Docker front door's IPAM over a node's Kubernetes
// store, as skeind wires it: pools by name work, new subnets are refused.
func dockerIPAM(t *testing.T, n *node) {
	drv, err := docker.New(docker.Options{Store: n.st, IPAM: n.ipam, Dataplane: noPlumber{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(drv.Handler())
	defer srv.Close()
	call := func(method string, req any) (int, map[string]any) {
		b, _ := json.Marshal(req)
		resp, err := http.Post(srv.URL+"/"+method, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, out := call("IpamDriver.RequestPool", map[string]any{"AddressSpace": docker.LocalAddressSpace, "Options": map[string]string{"skein.pool": "blue"}})
	if code != http.StatusOK {
		t.Fatalf("RequestPool skein.pool=blue: %d %v", code, out)
	}
	pid, _ := out["PoolID"].(string)
	code, out = call("IpamDriver.RequestAddress", map[string]any{"PoolID": pid})
	if code != http.StatusOK {
		t.Fatalf("RequestAddress: %d %v", code, out)
	}
	addr := netip.MustParsePrefix(out["Address"].(string)).Addr()
	if !netip.MustParsePrefix("10.81.0.0/24").Contains(addr) {
		t.Errorf("Docker got %v, want an address of pool blue", addr)
	}
	if code, out = call("IpamDriver.ReleaseAddress", map[string]any{"PoolID": pid, "Address": addr.String()}); code != http.StatusOK {
		t.Errorf("ReleaseAddress: %d %v", code, out)
	}
	code, out = call("IpamDriver.RequestPool", map[string]any{"AddressSpace": docker.LocalAddressSpace, "Pool": "10.200.0.0/24"})
	if code == http.StatusOK {
		// A new subnet becomes a pool when the network is created.
		code, out = call("NetworkDriver.CreateNetwork", map[string]any{"NetworkID": strings.Repeat("a", 64),
			"IPv4Data": []map[string]any{{"AddressSpace": docker.LocalAddressSpace, "Pool": "10.200.0.0/24"}}})
	}
	if msg, _ := out["Err"].(string); code == http.StatusOK || !strings.Contains(msg, "kubectl") {
		t.Errorf("a Docker network with a new subnet: %d %v, want it refused, saying pools are made with kubectl", code, out)
	}
}

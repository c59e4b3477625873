package daemon

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/api/rpc"
)

// TestAddRefusesHostNamespaces: an ADD naming the host's namespace (PID
// 1's), skeind's own or the node's must fail with code 4 before anything
// is allocated or plumbed (the fake kernel would otherwise "plumb" it).
func TestAddRefusesHostNamespaces(t *testing.T) {
	node := pinnedNS(t, "node", "/proc/1/ns/net and a pinned namespace")
	pod := pinnedNS(t, "pod", "/proc/1/ns/net and a pinned namespace")

	n := &testNode{t: t, path: filepath.Join(t.TempDir(), "skein.db"), kernel: newFakeKernel(),
		cfg: Config{Pools: []PoolSpec{{Name: "p", Subnets: []string{"10.0.0.0/24"}}}}}
	n.kernel.cfg.NodeNetNS = node
	if err := n.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.d.Close() })
	srv := &cniServer{d: n.d}
	conf := []byte(`{"cniVersion":"1.1.0","name":"net","type":"skein","pool":"p"}`)
	for _, ns := range []string{"/proc/1/ns/net", "/proc/self/ns/net", node} {
		reply, err := srv.Add(context.Background(), &rpc.CNIRequest{Netconf: conf, ContainerId: "c1", Ifname: "eth0", Netns: ns})
		if err != nil || reply.Error == nil || uint(reply.Error.Code) != types.ErrInvalidEnvironmentVariables {
			t.Errorf("ADD into %s: %v %v, want error code 4", ns, err, reply.GetError())
		}
		if n.used("p") != 0 || len(n.records()) != 0 || len(n.kernel.linkNames()) != 0 {
			t.Fatalf("ADD into %s was refused but changed something: used %d, records %d, links %v", ns, n.used("p"), len(n.records()), n.kernel.linkNames())
		}
	}
	// A pod's own namespace is fine.
	reply, err := srv.Add(context.Background(), &rpc.CNIRequest{Netconf: conf, ContainerId: "c1", Ifname: "eth0", Netns: pod})
	if err != nil || reply.Error != nil {
		t.Fatalf("ADD into a pod namespace: %v %v", err, reply.GetError())
	}
}

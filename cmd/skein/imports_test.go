package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps the CNI binary thin: it is exec'd for every ADD and DEL,
// so what it links decides how fast it starts. The daemon's dependencies
// (netlink, bbolt, grpc-go and the protobuf registry, Prometheus) must stay
// out of it.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	forbidden := []string{
		"google.golang.org/grpc",
		"google.golang.org/protobuf/reflect/protoregistry",
		"github.com/vishvananda/netlink",
		"go.etcd.io/bbolt",
		"github.com/prometheus/",
		"github.com/skeinnet/skein/internal/daemon",
		"github.com/skeinnet/skein/internal/dataplane",
		"github.com/skeinnet/skein/api/rpc",
		"net/http", // via golang.org/x/net/http2's Transport: ~0.4 ms of start-up
		// The CNI library's skel, types and version (with regexp, log and
		// a netns package): ~0.3 ms more per exec; internal/cniplugin
		// does skel's part itself.
		"github.com/containernetworking/cni/",
		"regexp",
		// Any protobuf package runs the module's init, which reads and
		// hashes the executable; internal/cniclient writes the wire format
		// itself.
		"google.golang.org/protobuf/",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
				t.Errorf("cmd/skein imports %s (via its dependencies); keep it out of the CNI binary", dep)
			}
		}
	}
}

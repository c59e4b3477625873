package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps skein-vm thin: the runtime execs it for every ADD and
// DEL; the work (netlink, nftables, DHCP) is skeind's.
func TestImports(t *testing.T) {
	forbid(t, ".", "skein-vm",
		"google.golang.org/grpc", "google.golang.org/protobuf/reflect/protoregistry", "github.com/skeinnet/skein/api/rpc",
		"github.com/vishvananda/netlink", "github.com/google/nftables", "github.com/insomniacslk/dhcp",
		"go.etcd.io/bbolt", "github.com/prometheus/",
		"github.com/skeinnet/skein/internal/daemon", "github.com/skeinnet/skein/internal/vm",
		"github.com/containernetworking/cni/", "regexp", "google.golang.org/protobuf/") // see cmd/skein
}

func forbid(t *testing.T, pkg, name string, forbidden ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
				t.Errorf("%s imports %s (via its dependencies); keep it out", name, dep)
			}
		}
	}
}

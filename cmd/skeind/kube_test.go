package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/daemon"
)

// TestStoreFlags: bad --store combinations are refused with a message
// naming the problem, before anything is opened or created.
func TestStoreFlags(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	withPool := daemon.Config{Node: "n1", StateDir: state, Pools: []daemon.PoolSpec{{Name: "default", Subnets: []string{"10.0.0.0/24"}}}}
	for _, tc := range []struct {
		name string
		kf   kubeFlags
		cfg  daemon.Config
		want string
	}{
		{"unknown store", kubeFlags{store: "etcd"}, daemon.Config{StateDir: state}, `--store "etcd"`},
		{"kubeconfig without kubernetes", kubeFlags{store: "embedded", kubeconfig: "/x"}, daemon.Config{StateDir: state}, "--kubeconfig needs --store kubernetes"},
		{"pools from skeind", kubeFlags{store: "kubernetes", kubeconfig: "/x"}, withPool, "--default-pool"},
		{"no node name", kubeFlags{store: "kubernetes", kubeconfig: "/x"}, daemon.Config{StateDir: state}, "needs --node"},
		{"missing kubeconfig", kubeFlags{store: "kubernetes", kubeconfig: filepath.Join(dir, "nope")}, daemon.Config{Node: "n1", StateDir: state}, "--kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := tc.kf.openStore(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("openStore = %v, %v; want an error containing %q", st, err, tc.want)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("the state directory was created (%v)", err)
			}
		})
	}
	if st, err := (kubeFlags{store: "embedded"}).openStore(context.Background(), daemon.Config{StateDir: state}); st != nil || err != nil {
		t.Errorf("embedded: %v, %v; want nil (the daemon opens its own store)", st, err)
	}
}

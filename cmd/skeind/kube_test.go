package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/routing"
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
			cfg := tc.cfg
			kn, err := tc.kf.openKube(context.Background(), &cfg, routing.ModeExport, slog.Default())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("openKube = %v, %v; want an error containing %q", kn, err, tc.want)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("the state directory was created (%v)", err)
			}
		})
	}
	cfg := daemon.Config{StateDir: state}
	if kn, err := (kubeFlags{store: "embedded"}).openKube(context.Background(), &cfg, routing.ModeExport, slog.Default()); kn != nil || err != nil || cfg.Store != nil {
		t.Errorf("embedded: %v, %v, store %v; want nothing (the daemon opens its own store)", kn, err, cfg.Store)
	}
}

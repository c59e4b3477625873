package kubelet

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/kube"
)

// HoldEnv names the directory `make cluster` gives TestLocalCluster.
const HoldEnv = "SKEIN_CLUSTER_HOLD"

// TestLocalCluster is `make cluster` (scripts/cluster.sh): the cluster of
// TestKubeletNode with skein installed and a dual-stack "default" pool,
// held for a person until $SKEIN_CLUSTER_HOLD/down appears or the process
// gets SIGTERM or SIGINT; then everything is torn down as after a test.
// It writes a kubectl wrapper (kubectl in the control plane's namespace,
// as the admin) and "ready" into that directory. Without the variable it
// is skipped: it is not a test.
func TestLocalCluster(t *testing.T) {
	dir := os.Getenv(HoldEnv)
	if dir == "" {
		t.Skip("skipping: not a test; make cluster runs it with " + HoldEnv + " set")
	}
	c := Start(t, Options{})
	c.Install(t, filepath.Join(c.Root, "test", "kubelet", "overlay"))
	c.CreatePool(t, "default", "10.244.0.0/24", "fd00:244::/120", 4)
	c.WaitNodesReady(t)

	kc, err := c.Env.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	wrapper := fmt.Sprintf("#!/bin/sh\n# kubectl against the skein test cluster (make cluster)\nexec nsenter --net=%s -- %s --kubeconfig %s \"$@\"\n",
		c.CP.Path(), filepath.Join(kube.AssetsDir(), "kubectl"), kc)
	if err := os.WriteFile(filepath.Join(dir, "kubectl"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	var nodes string
	for _, n := range c.Nodes {
		nodes += fmt.Sprintf("%s: nsenter --net=%s (addresses %s, %s)\n", n.Name, n.NS.Path(), n.IPv4, n.IPv6)
	}
	if err := os.WriteFile(filepath.Join(dir, "nodes"), []byte(nodes), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte("ok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	for {
		if _, err := os.Stat(filepath.Join(dir, "down")); err == nil {
			break
		}
		select {
		case s := <-sig:
			t.Logf("%v: tearing the cluster down", s)
			return
		case <-time.After(time.Second):
		}
	}
	t.Log("down requested: tearing the cluster down")
}

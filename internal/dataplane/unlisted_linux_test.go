package dataplane_test

import (
	"errors"
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/test/harness"
)

// TestTeardownReturnsWhenUnlisted: Teardown returns on the kernel's
// announcement that the host veth is gone, not when the kernel has freed
// it (the deletes are held back here), and by then nothing of the
// attachment can be seen: the node and the pod are as before the Setup,
// neither end's sysctl directories are left, and the same attachment —
// names, addresses, pod — can be set up again at once.
func TestTeardownReturnsWhenUnlisted(t *testing.T) {
	harness.RequireRoot(t)
	node, d := newNode(t, dataplane.Config{NodeForwarding: true})
	release := dataplane.HoldDeletes(d)
	defer release()
	pod := harness.NewNS(t, "unl")
	nodeBefore, podBefore := harness.Snapshot(t, node), harness.Snapshot(t, pod)
	l := podLink(pod, 1, "10.100.4.2", "fd00:100:4::2")
	for round := range 3 {
		if _, err := d.Setup(l); err != nil {
			t.Fatalf("round %d: Setup: %v", round, err)
		}
		ended := make(chan error, 1)
		go func() { ended <- d.Teardown(l.HostName, l.NetNS, l.IfName, l.Addrs) }()
		select {
		case err := <-ended:
			if err != nil {
				t.Fatalf("round %d: Teardown: %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Teardown did not return on the kernel's announcement", round)
		}
		// What netlink dumps do not show: the sysctl directories, which
		// go with each end's unregistering.
		for _, c := range []struct{ ns, dev string }{{node.Path(), l.HostName}, {pod.Path(), l.IfName}} {
			for _, fam := range []string{"ipv4", "ipv6"} {
				dir := "/proc/sys/net/" + fam + "/conf/" + c.dev
				err := netns.Do(c.ns, func() error { _, err := os.Stat(dir); return err })
				if !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("round %d: %s in %s after Teardown: %v", round, dir, c.ns, err)
				}
			}
		}
		harness.AssertSame(t, nodeBefore, harness.Snapshot(t, node))
		harness.AssertSame(t, podBefore, harness.Snapshot(t, pod))
	}
}

package dataplane_test

import (
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/test/harness"
)

// TestTeardownReturnsWhenUnlisted: Teardown returns on the kernel's
// announcement that the host veth is gone, not when the kernel has freed
// it (the deletes are held back here), and by then nothing of the
// attachment can be seen: the node and the pod are as before the Setup,
// and the same attachment — names, addresses, pod — can be set up again at
// once.
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
		harness.AssertSame(t, nodeBefore, harness.Snapshot(t, node))
		harness.AssertSame(t, podBefore, harness.Snapshot(t, pod))
	}
}

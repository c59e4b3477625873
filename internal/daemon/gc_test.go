package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/store"
)

// gcRequest is a CNI GC of network "net" listing no attachment as valid.
func gcRequest() *rpc.CNIRequest {
	return &rpc.CNIRequest{Netconf: []byte(`{"cniVersion":"1.1.0","name":"net","type":"skein","pool":"p","cni.dev/valid-attachments":[]}`)}
}

func (n *testNode) gc() {
	n.t.Helper()
	reply, err := (&cniServer{d: n.d}).GC(context.Background(), gcRequest())
	if err != nil || reply.Error != nil {
		n.t.Fatalf("GC: %v %v", err, reply.GetError())
	}
}

func (n *testNode) has(k store.AttachmentKey) bool {
	n.t.Helper()
	_, err := n.st.GetAttachment(context.Background(), k)
	return err == nil
}

// TestGCRemovesStale: an attachment the runtime does not list goes.
func TestGCRemovesStale(t *testing.T) {
	n := newTestNode(t, Config{})
	if _, _, err := n.d.Attach(context.Background(), attachReq("old")); err != nil {
		t.Fatal(err)
	}
	n.gc()
	if n.has(key("old")) || n.used("p") != 0 || len(n.kernel.linkNames()) != 0 {
		t.Fatalf("stale attachment kept: record %v, used %d, links %v", n.has(key("old")), n.used("p"), n.kernel.linkNames())
	}
}

// TestGCSparesAddInFlight: the record of an ADD is written while the
// kernel is programmed, so a GC arriving then lists it; the runtime could
// not list it (the ADD has not returned). GC must leave it alone.
func TestGCSparesAddInFlight(t *testing.T) {
	n := newTestNode(t, Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	n.kernel.setupHook = func() { close(entered); <-release }
	added := make(chan error, 1)
	go func() {
		_, _, err := n.d.Attach(context.Background(), attachReq("busy"))
		added <- err
	}()
	<-entered
	for !n.has(key("busy")) { // the record is written beside Setup
		time.Sleep(time.Millisecond)
	}
	gcDone := make(chan struct{})
	go func() { n.gc(); close(gcDone) }()
	// Let GC run into the key's lock if it is going to, then finish ADD.
	time.Sleep(50 * time.Millisecond)
	close(release)
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	<-gcDone
	if !n.has(key("busy")) || n.used("p") != 2 || len(n.kernel.linkNames()) != 1 {
		t.Fatalf("GC removed an attachment whose ADD was in flight: record %v, used %d, links %v", n.has(key("busy")), n.used("p"), n.kernel.linkNames())
	}
}

// TestGCSparesNewerAdd: an ADD that starts after the GC request did (and
// so after the runtime made its list) is not garbage, even if GC finds
// its record.
func TestGCSparesNewerAdd(t *testing.T) {
	n := newTestNode(t, Config{})
	if _, _, err := n.d.Attach(context.Background(), attachReq("old")); err != nil {
		t.Fatal(err)
	}
	n.st.onList = func() {
		n.st.onList = nil
		time.Sleep(2 * time.Millisecond) // a clock tick past the GC's start
		if _, _, err := n.d.Attach(context.Background(), attachReq("new")); err != nil {
			t.Error(err)
		}
	}
	n.gc()
	if n.has(key("old")) {
		t.Error("the stale attachment was kept")
	}
	if !n.has(key("new")) || n.used("p") != 2 {
		t.Errorf("GC removed an attachment added after it started: record %v, used %d", n.has(key("new")), n.used("p"))
	}
}

package kurma_test

import (
	"context"
	"errors"
	"testing"

	"github.com/skeinnet/skein/internal/kurma"
)

// TestRecordKeys: one pod, two records (AttachRequest.Key). A key that is
// not the pod's, or not a valid key, fails with ErrBadRequest and changes
// nothing; DetachIf of one record leaves the other's interface and record;
// Status shows the pod's attachments of both; Detach of the pod removes
// every record.
func TestRecordKeys(t *testing.T) {
	w := newWorld(t, testNets)
	ctx := context.Background()
	ns := w.pod()
	for _, r := range []kurma.AttachRequest{
		{ID: "pod-k", Key: "pod-k/a", NetNS: ns.Path(), Networks: sel("pods@eth0")},
		{ID: "pod-k", Key: "pod-k/b", NetNS: ns.Path(), Networks: sel("good@net1")},
	} {
		if _, err := w.pods.Attach(ctx, r); err != nil {
			t.Fatalf("attach %s: %v", r.Key, err)
		}
	}
	st, err := w.pods.Status(ctx, "pod-k")
	if err != nil || !equal(names(st.Attachments), []string{"pods@eth0", "good@net1"}) {
		t.Fatalf("status of pod-k: %v %v, want both records' attachments", names(st.Attachments), err)
	}

	for _, key := range []string{"pod-x/a", "pod-k/", "pod-k/a b", "pod-k/\x01"} {
		_, err := w.pods.Attach(ctx, kurma.AttachRequest{ID: "pod-k", Key: key, NetNS: ns.Path(), Networks: sel("oldstyle@net2")})
		if !errors.Is(err, kurma.ErrBadRequest) {
			t.Errorf("attach with key %q: %v, want ErrBadRequest", key, err)
		}
	}
	if got := links(t, ns); !equal(got, []string{"eth0", "net1"}) {
		t.Errorf("interfaces after refused attaches: %v", got)
	}
	if recs, _ := w.pods.List(ctx); len(recs) != 2 {
		t.Errorf("%d records after refused attaches, want 2", len(recs))
	}

	if _, err := w.pods.DetachIf(ctx, "pod-k/a", nil); err != nil {
		t.Fatalf("detach pod-k/a: %v", err)
	}
	if got := links(t, ns); !equal(got, []string{"net1"}) {
		t.Errorf("interfaces after detaching record a: %v, want [net1]", got)
	}
	if r, err := w.pods.Record(ctx, "pod-k/b"); err != nil || !equal(names(r.Attachments), []string{"good@net1"}) {
		t.Errorf("record b after detaching a: %v %v", names(r.Attachments), err)
	}
	if _, err := w.pods.Record(ctx, "pod-k/a"); !errors.Is(err, kurma.ErrUnknownPod) {
		t.Errorf("record a after its detach: %v, want ErrUnknownPod", err)
	}

	if err := w.pods.Detach(ctx, "pod-k"); err != nil {
		t.Fatalf("detach pod-k: %v", err)
	}
	w.assertNothingLeft("pod-k", ns)
}

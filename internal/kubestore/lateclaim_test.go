package kubestore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/test/kube"
)

// lateAnswers holds back the API server's answer to the next create of an
// AddressBlock until the client has given up: the create happens, the
// caller never hears of it. It is the race a claim's timeout opens.
type lateAnswers struct {
	armed   atomic.Bool
	created atomic.Value // the status of the create whose answer was held back
}

// wrap is a rest.Config's WrapTransport.
func (l *lateAnswers) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(r)
		if err != nil || r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/addressblocks") || !l.armed.CompareAndSwap(true, false) {
			return resp, err
		}
		resp.Body.Close()
		l.created.Store(resp.Status)
		<-r.Context().Done() // the answer arrives after the caller gave up
		return nil, r.Context().Err()
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A claim whose answer arrives late (the API server made the block, the
// node's create had timed out and the ADD failed): the caller is told to
// try again, its retry works, and nothing is left: no AddressBlock of
// the node that the node does not know, no address held once the pod
// goes, every block given back once unused.
func TestLateClaimAnswer(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "late", "10.89.0.0/24", 3)
	late := &lateAnswers{}
	// The node reaches the API server through lateAnswers (startNode
	// reads only the Env's Config).
	slow := &kube.Env{Config: rest.CopyConfig(env.Config)}
	slow.Config.Wrap(late.wrap)
	n := startNode(t, slow, "node-late", t.TempDir(), nodeOpts{run: true, timeout: time.Second, minBlockAge: 200 * time.Millisecond})

	late.armed.Store(true)
	_, err := n.ipam.Allocate(ctx, ipam.Request{Pool: "late"})
	if !errors.Is(err, ipam.ErrTryAgain) {
		t.Fatalf("ADD whose claim was answered late: %v, want ErrTryAgain", err)
	}
	if st, _ := late.created.Load().(string); !strings.HasPrefix(st, "201") {
		t.Fatalf("the create of an AddressBlock whose answer was held back: %q, want 201 Created", st)
	}
	// The held-back create is in the API; the node may have claimed
	// another block since (a refill in the background, or its retry), but
	// every block of the pool is node-late's.
	made := allBlocks(t, c, "late")
	if len(made) == 0 {
		t.Fatalf("after the late answer the API has no block of pool late, want the one node-late's create made")
	}
	for _, b := range made {
		if b.NodeName != "node-late" {
			t.Fatalf("after the late answer block %s of pool late is node %q's, want node-late's", b.Name, b.NodeName)
		}
	}

	// The caller tries again, as the runtime retries an ADD.
	x := alloc(t, n, "late")
	if blk, ok := blockOfAddr(t, c, "late", x); !ok || blk.NodeName != "node-late" {
		t.Fatalf("the retried ADD got %v in block %s of node %q, want a block of node-late", x, blk.Name, blk.NodeName)
	}
	// Every block of the node in the API is one the node knows: it owns it
	// and exports it.
	eventually(t, "node-late knowing every block the API gives it", func() error {
		for _, blk := range allBlocks(t, c, "late") {
			if blk.NodeName != "node-late" || !blk.DeletionTimestamp.IsZero() {
				continue
			}
			if !n.st.Owns("late", uint32(blk.Index), "node-late") || !slices.Contains(n.ipam.OwnedBlocks(), netip.MustParsePrefix(*blk.IPv4)) {
				return fmt.Errorf("block %s is node-late's in the API, but node-late does not know it", blk.Name)
			}
		}
		return nil
	})

	// The pod goes: no address held, and every block goes back.
	n.ipam.Release(ctx, "late", []netip.Addr{x})
	eventually(t, "every block of pool late given back", func() error {
		if left := allBlocks(t, c, "late"); len(left) > 0 {
			return fmt.Errorf("%d blocks left, the first %s of node %q", len(left), left[0].Name, left[0].NodeName)
		}
		return nil
	})
	if u, err := n.ipam.Usage(ctx, "late"); err != nil || u.Used != 0 || u.Blocks != 0 {
		t.Errorf("node-late's usage of pool late at the end: %+v, %v; want no address held and no block", u, err)
	}
}

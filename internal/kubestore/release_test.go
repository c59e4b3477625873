package kubestore_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ipam"
)

// TestReleaseDeleteFails: a block given back whose DELETE fails (a reset
// connection, an API server restarting) is still the node's: it is not
// reported lost (nobody took it), and it is given back at a later try
// instead of staying in the API, unused, until a restart.
func TestReleaseDeleteFails(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "blue", "10.81.0.0/24", 3)
	var failDeletes atomic.Int32
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodDelete && strings.Contains(r.URL.Path, "/addressblocks/") && failDeletes.Add(-1) >= 0 {
				return nil, errors.New("read tcp: connection reset by peer")
			}
			return rt.RoundTrip(r)
		})
	})
	st := storeVia(t, cfg, "node-x", time.Hour)
	lost := make(chan uint32, 16)
	m, err := ipam.NewManager(ipam.Options{Store: st, Node: "node-x", Cluster: ipam.ClusterOptions{
		MinBlockAge: 50 * time.Millisecond, DefaultPool: "none", OnBlockLost: func(_ string, i uint32, _ int) { lost <- i }}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Allocate(ctx, ipam.Request{Pool: "blue"})
	if err != nil {
		t.Fatal(err)
	}
	blk, ok := blockOfAddr(t, c, "blue", got[0])
	if !ok {
		t.Fatalf("no block holds %v", got[0])
	}
	m.Release(ctx, "blue", got)
	time.Sleep(200 * time.Millisecond)
	failDeletes.Store(1) // the next DELETE of a block fails, once
	if _, err := m.FreeUnusedBlocks(ctx); err == nil {
		t.Fatal("the give-back whose DELETE failed reported no error")
	}
	gone := false
	for range 20 {
		if _, err := m.FreeUnusedBlocks(ctx); err != nil {
			t.Logf("give-back: %v", err)
		}
		now := &skeinv1.AddressBlock{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(&blk), now); err != nil || now.UID != blk.UID {
			gone = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case i := <-lost:
		t.Errorf("block %d reported lost (BlockLost event, skein_blocks_lost_total): nobody took it", i)
	default:
	}
	if !gone {
		t.Errorf("block %s is still in the API, empty, 2 s after its give-back failed once: leaked", blk.Name)
	}
}

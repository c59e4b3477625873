package kubestore_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/internal/controller"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/store"
)

// cutDialer dials the API server until partition is called, which also
// closes every connection it made: the node is cut off, as by a network
// partition; heal lets it dial again.
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
	base  func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (d *cutDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("partitioned: no route to host")
	}
	c, err := d.base(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cutDialer) partition() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

func (d *cutDialer) heal() {
	d.mu.Lock()
	d.cut = false
	d.mu.Unlock()
}

// TestFencedWhileLeaseExpired: a node cut off from the API server while
// its Node is deleted (no Node object here) loses its blocks to the
// controller once its Lease expires, and another node gets them. From the
// moment its own Lease may have expired it hands out no address and
// routes no block, so no address is ever on two nodes; once it can renew
// again, it reads what it owns from the API server before it allocates,
// and allocates elsewhere.
func TestFencedWhileLeaseExpired(t *testing.T) {
	env, c := startEnv(t)
	ctx := context.Background()
	createPool(t, c, "default", "10.80.0.0/24", 3) // 32 blocks of 8
	d := &cutDialer{base: env.Config.Dial}
	if d.base == nil {
		d.base = (&net.Dialer{}).DialContext
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Dial = d.dial
	const lease = 2 * time.Second
	st := storeVia(t, cfg, "node-a", lease)
	a, err := ipam.NewManager(ipam.Options{Store: st, Node: "node-a", Cluster: ipam.ClusterOptions{MinBlockAge: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.Allocate(ctx, ipam.Request{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	blk, ok := blockOfAddr(t, c, "default", first[0])
	if !ok {
		t.Fatalf("no block holds %v", first[0])
	}
	block := netip.MustParsePrefix(*blk.IPv4)
	if got := a.ExportedBlocks(); len(got) != 1 || got[0] != block {
		t.Fatalf("exported %v, want %v", got, block)
	}

	d.partition()
	cut := time.Now()
	for st.Fenced() == nil {
		if time.Since(cut) > 2*lease {
			t.Fatalf("not fenced %v after the cut (Lease %v)", time.Since(cut), lease)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("fenced %v after the cut: %v", time.Since(cut).Round(10*time.Millisecond), st.Fenced())
	if _, err := a.Allocate(ctx, ipam.Request{Pool: "default"}); !errors.Is(err, ipam.ErrTryAgain) {
		t.Errorf("an ADD while fenced: %v, want ErrTryAgain", err)
	}
	if got := a.ExportedBlocks(); len(got) != 0 {
		t.Errorf("exported %v while fenced, want none", got)
	}

	// The controller takes the block once the Lease has expired (and its
	// grace); another node gets it and fills it.
	gc := &controller.NodeGCReconciler{Client: c, Grace: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := gc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: "node-a"}}); err != nil {
			t.Logf("gc: %v", err)
		}
		if _, still := blockOfAddr(t, c, "default", first[0]); !still {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the controller never took node-a's block")
		}
		time.Sleep(200 * time.Millisecond)
	}
	b := startNode(t, env, "node-b", t.TempDir(), nodeOpts{})
	onB := map[netip.Addr]bool{}
	for x := block.Addr(); block.Contains(x); x = x.Next() {
		for deadline := time.Now().Add(10 * time.Second); ; {
			_, err := b.ipam.Allocate(ctx, ipam.Request{Pool: "default", Static: []netip.Addr{x}})
			if err == nil {
				onB[x] = true
				break
			}
			if errors.Is(err, ipam.ErrReserved) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if now, _ := blockOfAddr(t, c, "default", first[0]); now.NodeName != "node-b" || len(onB) == 0 {
		t.Fatalf("block %s is %q's with %d of its addresses on node-b, want node-b's", now.Name, now.NodeName, len(onB))
	}
	for range 3 {
		if got, err := a.Allocate(ctx, ipam.Request{Pool: "default"}); err == nil {
			t.Errorf("node-a, fenced, handed out %v (node-b holds it: %v)", got, onB[got[0]])
		}
	}

	// Healed: the Lease is renewed, what node-a owns is read again, and it
	// allocates from a block of its own, not from node-b's.
	d.heal()
	for healed := time.Now(); st.Fenced() != nil; {
		if time.Since(healed) > 2*lease {
			t.Fatalf("still fenced %v after healing: %v", time.Since(healed), st.Fenced())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// At once, before anything looked at the block again: not exported.
	for _, p := range a.ExportedBlocks() {
		if p == block {
			t.Errorf("node-a exports node-b's block %v as soon as it is no longer fenced", p)
		}
	}
	for range 3 {
		got, err := a.Allocate(ctx, ipam.Request{Pool: "default"})
		if err != nil {
			t.Fatalf("an ADD after healing: %v", err)
		}
		if block.Contains(got[0]) {
			t.Errorf("node-a handed out %v from block %s, node-b's now (node-b holds it: %v)", got[0], blk.Name, onB[got[0]])
		}
	}
	for _, p := range a.ExportedBlocks() {
		if p == block {
			t.Errorf("node-a exports node-b's block %v after healing", p)
		}
	}
}

// storeVia is node's Store over its own bolt file, talking to the API
// server through cfg (a dialer or transport the test controls), its Lease
// lasting lease; closed at the test's end.
func storeVia(t *testing.T, cfg *rest.Config, node string, lease time.Duration) *kubestore.Store {
	t.Helper()
	local, err := store.OpenBolt(filepath.Join(t.TempDir(), "skein.db"), store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := kubestore.New(context.Background(), kubestore.Options{Config: cfg, Node: node, Local: local, LeaseDuration: lease})
	if err != nil {
		local.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTest(t *testing.T) (*Bolt, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state", "skein.db")
	s, err := OpenBolt(path, BoltOptions{})
	if err != nil {
		t.Fatalf("OpenBolt: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func testPool(name string, subnets ...string) Pool {
	p := Pool{Name: name, BlockSizeBits: 5, Created: time.Unix(1700000000, 0).UTC()}
	for _, s := range subnets {
		p.Subnets = append(p.Subnets, netip.MustParsePrefix(s))
	}
	return p
}

func testAttachment(net, ctr string, addrs ...string) Attachment {
	a := Attachment{
		AttachmentKey: AttachmentKey{Network: net, ContainerID: ctr, IfName: "eth0"},
		Pool:          "p",
		Owner:         "cni",
		Created:       time.Unix(1700000000, 0).UTC(),
		Extra:         []byte(`{"x":1}`),
	}
	for _, s := range addrs {
		a.Addrs = append(a.Addrs, netip.MustParseAddr(s))
	}
	return a
}

func TestPools(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	p := testPool("p", "10.0.0.0/24", "fd00::/64")
	p.Reserved = []string{"10.0.0.1"}
	if err := s.CreatePool(ctx, p, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.CreatePool(ctx, p, nil); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate CreatePool: got %v, want ErrExists", err)
	}
	got, err := s.GetPool(ctx, "p")
	if err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("GetPool = %+v, %v; want %+v", got, err, p)
	}
	if _, err := s.GetPool(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetPool unknown: %v", err)
	}

	// check sees the existing pools and can veto, inside the transaction.
	veto := errors.New("veto")
	var seen []string
	err = s.CreatePool(ctx, testPool("q", "10.1.0.0/24"), func(existing []Pool) error {
		for _, e := range existing {
			seen = append(seen, e.Name)
		}
		return veto
	})
	if !errors.Is(err, veto) || !reflect.DeepEqual(seen, []string{"p"}) {
		t.Fatalf("vetoed CreatePool: err %v, seen %v", err, seen)
	}
	if _, err := s.GetPool(ctx, "q"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("vetoed pool was stored: %v", err)
	}
	if err := s.CreatePool(ctx, testPool("q", "10.1.0.0/24"), func([]Pool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	pools, err := s.ListPools(ctx)
	if err != nil || len(pools) != 2 || pools[0].Name != "p" || pools[1].Name != "q" {
		t.Fatalf("ListPools = %v, %v", pools, err)
	}
}

func TestDeletePool(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	for _, name := range []string{"p", "q"} {
		if err := s.CreatePool(ctx, testPool(name, "10.0.0.0/24"), nil); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if _, err := s.ClaimBlock(ctx, name, "n1", 8, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := testAttachment("net", "c1", "10.0.0.2")
	if err := s.PutAttachment(ctx, a); err != nil {
		t.Fatal(err)
	}
	other := testAttachment("net", "c2", "10.0.0.3")
	other.Pool = "q"
	if err := s.PutAttachment(ctx, other); err != nil {
		t.Fatal(err)
	}

	// check is given exactly the pool's attachments; its error aborts.
	inUse := errors.New("in use")
	err := s.DeletePool(ctx, "p", func(holders []Attachment) error {
		if len(holders) != 1 || holders[0].AttachmentKey != a.AttachmentKey {
			t.Errorf("holders = %v", holders)
		}
		return inUse
	})
	if !errors.Is(err, inUse) {
		t.Fatalf("DeletePool with holders: %v", err)
	}
	if bs, _ := s.ListBlocks(ctx, "p"); len(bs) != 3 {
		t.Fatalf("refused DeletePool removed blocks: %v", bs)
	}

	if err := s.DeletePool(ctx, "p", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPool(ctx, "p"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pool survived delete: %v", err)
	}
	if bs, _ := s.ListBlocks(ctx, "p"); len(bs) != 0 {
		t.Fatalf("blocks survived delete: %v", bs)
	}
	if bs, _ := s.ListBlocks(ctx, ""); len(bs) != 3 || bs[0].Pool != "q" {
		t.Fatalf("other pool's blocks: %v", bs)
	}
	if err := s.DeletePool(ctx, "p", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second DeletePool: %v", err)
	}
	// A re-created pool starts with no blocks.
	if err := s.CreatePool(ctx, testPool("p", "10.0.0.0/24"), nil); err != nil {
		t.Fatal(err)
	}
	if b, err := s.ClaimBlock(ctx, "p", "n2", 8, nil, nil); err != nil || b.Index != 0 {
		t.Fatalf("claim in re-created pool: %v, %v", b, err)
	}
}

func u32(i uint32) *uint32 { return &i }

func TestClaimBlock(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	if err := s.CreatePool(ctx, testPool("p", "10.0.0.0/24"), nil); err != nil {
		t.Fatal(err)
	}
	const limit = 8
	claim := func(node string, want *uint32, ok func(uint32) bool) (Block, error) {
		return s.ClaimBlock(ctx, "p", node, limit, want, ok)
	}
	even := func(i uint32) bool { return i%2 == 0 }

	steps := []struct {
		name    string
		node    string
		want    *uint32
		ok      func(uint32) bool
		index   uint32
		owner   string
		wantErr error
	}{
		{name: "lowest", node: "n1", index: 0, owner: "n1"},
		{name: "next lowest", node: "n2", index: 1, owner: "n2"},
		{name: "want free", node: "n1", want: u32(5), index: 5, owner: "n1"},
		{name: "want own again", node: "n1", want: u32(5), index: 5, owner: "n1"},
		{name: "want other's", node: "n1", want: u32(1), index: 1, owner: "n2", wantErr: ErrConflict},
		{name: "want beyond limit", node: "n1", want: u32(limit), wantErr: ErrNotFound},
		{name: "fills gap", node: "n1", index: 2, owner: "n1"},
		{name: "ok filter", node: "n1", ok: even, index: 4, owner: "n1"},
		{name: "ok filter skips used", node: "n2", ok: even, index: 6, owner: "n2"},
		{name: "ok filter exhausted", node: "n2", ok: even, wantErr: ErrExhausted},
		{name: "lowest after gaps", node: "n2", index: 3, owner: "n2"},
		{name: "last", node: "n2", index: 7, owner: "n2"},
		{name: "exhausted", node: "n1", wantErr: ErrExhausted},
	}
	for _, st := range steps {
		b, err := claim(st.node, st.want, st.ok)
		if !errors.Is(err, st.wantErr) {
			t.Fatalf("%s: err %v, want %v", st.name, err, st.wantErr)
		}
		if st.wantErr == ErrExhausted || st.wantErr == ErrNotFound {
			continue
		}
		if b.Pool != "p" || b.Index != st.index || b.Node != st.owner {
			t.Fatalf("%s: got %+v, want index %d owner %s", st.name, b, st.index, st.owner)
		}
		if st.wantErr == ErrConflict && !strings.Contains(err.Error(), `"n2"`) {
			t.Fatalf("%s: error does not name the owner: %v", st.name, err)
		}
	}
	bs, err := s.ListBlocks(ctx, "p")
	if err != nil || len(bs) != limit {
		t.Fatalf("ListBlocks = %v, %v", bs, err)
	}
	owners := map[uint32]string{0: "n1", 1: "n2", 2: "n1", 3: "n2", 4: "n1", 5: "n1", 6: "n2", 7: "n2"}
	for _, b := range bs {
		if owners[b.Index] != b.Node {
			t.Errorf("block %d owned by %s, want %s", b.Index, b.Node, owners[b.Index])
		}
	}

	if _, err := s.ClaimBlock(ctx, "nope", "n1", limit, nil, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("claim in unknown pool: %v", err)
	}
}

func TestClaimBlockBigIndices(t *testing.T) {
	// Keys are big-endian, so the cursor walk must see 256 after 255.
	ctx := context.Background()
	s, _ := openTest(t)
	if err := s.CreatePool(ctx, testPool("p", "10.0.0.0/8"), nil); err != nil {
		t.Fatal(err)
	}
	for i := uint32(0); i < 300; i++ {
		if i == 256 {
			continue
		}
		if _, err := s.ClaimBlock(ctx, "p", "n1", 1<<19, &i, nil); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := s.ClaimBlock(ctx, "p", "n1", 1<<19, nil, nil); err != nil || b.Index != 256 {
		t.Fatalf("got %v, %v; want block 256", b, err)
	}
	if b, err := s.ClaimBlock(ctx, "p", "n1", 1<<19, nil, nil); err != nil || b.Index != 300 {
		t.Fatalf("got %v, %v; want block 300", b, err)
	}
}

func TestReleaseBlock(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	if err := s.CreatePool(ctx, testPool("p", "10.0.0.0/24"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimBlock(ctx, "p", "n1", 8, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseBlock(ctx, "p", 0, "n2"); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), `"n1"`) {
		t.Fatalf("release by non-owner: %v", err)
	}
	if err := s.ReleaseBlock(ctx, "p", 0, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseBlock(ctx, "p", 0, "n1"); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if err := s.ReleaseBlock(ctx, "nope", 0, "n1"); err != nil {
		t.Fatalf("release in unknown pool: %v", err)
	}
	if b, err := s.ClaimBlock(ctx, "p", "n2", 8, nil, nil); err != nil || b.Index != 0 || b.Node != "n2" {
		t.Fatalf("reclaim: %v, %v", b, err)
	}
}

// withPool creates pool "p", which testAttachment's records name.
func withPool(t *testing.T, s *Bolt) *Bolt {
	t.Helper()
	if err := s.CreatePool(context.Background(), testPool("p", "10.0.0.0/24", "fd00::/120"), nil); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAttachments(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	orphan := testAttachment("net", "c0", "10.0.0.9")
	if err := s.PutAttachment(ctx, orphan); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Put for a pool that does not exist: %v, want ErrNotFound", err)
	}
	withPool(t, s)
	a := testAttachment("net", "c1", "10.0.0.2", "fd00::2")
	if err := s.PutAttachment(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.PutAttachment(ctx, a); !errors.Is(err, ErrExists) {
		t.Fatalf("second Put: %v", err)
	}
	got, err := s.GetAttachment(ctx, a.AttachmentKey)
	if err != nil || !reflect.DeepEqual(got, a) {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, a)
	}
	// Keys differing only in one field are distinct.
	for _, k := range []AttachmentKey{
		{Network: "net", ContainerID: "c1", IfName: "eth1"},
		{Network: "net2", ContainerID: "c1", IfName: "eth0"},
		{Network: "net", ContainerID: "c2", IfName: "eth0"},
	} {
		if _, err := s.GetAttachment(ctx, k); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get %v: %v", k, err)
		}
	}

	a.HostLink = "skein1234"
	a.Addrs = a.Addrs[:1]
	if err := s.UpdateAttachment(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetAttachment(ctx, a.AttachmentKey); !reflect.DeepEqual(got, a) {
		t.Fatalf("after Update: %+v", got)
	}
	absent := testAttachment("net", "c9")
	if err := s.UpdateAttachment(ctx, absent); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Update absent: %v", err)
	}
	if _, err := s.GetAttachment(ctx, absent.AttachmentKey); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Update absent created it: %v", err)
	}

	b := testAttachment("net", "c0", "10.0.0.3")
	if err := s.PutAttachment(ctx, b); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListAttachments(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("List = %v, %v", list, err)
	}
	SortAttachments(list)
	if list[0].ContainerID != "c0" || list[1].ContainerID != "c1" {
		t.Fatalf("sorted = %v", list)
	}

	if err := s.DeleteAttachment(ctx, a.AttachmentKey); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAttachment(ctx, a.AttachmentKey); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if _, err := s.GetAttachment(ctx, a.AttachmentKey); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get deleted: %v", err)
	}
	// The key is free again.
	if err := s.PutAttachment(ctx, a); err != nil {
		t.Fatalf("Put after Delete: %v", err)
	}
}

func TestMeta(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	if _, err := s.GetMeta(ctx, "docker-network", "n1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get in missing kind: %v", err)
	}
	if m, err := s.ListMeta(ctx, "docker-network"); err != nil || len(m) != 0 {
		t.Fatalf("List missing kind: %v, %v", m, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.PutMeta(ctx, "docker-network", "n1", []byte("one")))
	must(s.PutMeta(ctx, "docker-network", "n2", []byte("two")))
	must(s.PutMeta(ctx, "docker-endpoint", "n1", []byte("ep")))
	must(s.PutMeta(ctx, "docker-network", "n2", []byte("two'")))
	must(s.PutMeta(ctx, "docker-network", "empty", []byte{}))
	if v, err := s.GetMeta(ctx, "docker-network", "n2"); err != nil || string(v) != "two'" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if v, err := s.GetMeta(ctx, "docker-network", "empty"); err != nil || len(v) != 0 {
		t.Fatalf("Get empty = %q, %v", v, err)
	}
	if _, err := s.GetMeta(ctx, "docker-network", "n3"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get missing key: %v", err)
	}
	m, err := s.ListMeta(ctx, "docker-network")
	want := map[string][]byte{"n1": []byte("one"), "n2": []byte("two'"), "empty": {}}
	if err != nil || !reflect.DeepEqual(m, want) {
		t.Fatalf("List = %q, %v", m, err)
	}
	must(s.PutMeta(ctx, "docker-network", "n1", nil))
	must(s.PutMeta(ctx, "docker-network", "n1", nil)) // idempotent
	if _, err := s.GetMeta(ctx, "docker-network", "n1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get deleted: %v", err)
	}
	if v, err := s.GetMeta(ctx, "docker-endpoint", "n1"); err != nil || string(v) != "ep" {
		t.Fatalf("other kind: %q, %v", v, err)
	}
}

func TestReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "skein.db")
	s, err := OpenBolt(path, BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.Describe(), path) {
		t.Errorf("Describe = %q", s.Describe())
	}
	p := testPool("p", "10.0.0.0/24")
	a := testAttachment("net", "c1", "10.0.0.2")
	for _, err := range []error{
		s.CreatePool(ctx, p, nil),
		s.PutAttachment(ctx, a),
		s.PutMeta(ctx, "k", "x", []byte("v")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ClaimBlock(ctx, "p", "n1", 8, u32(3), nil); err != nil {
		t.Fatal(err)
	}
	// A second open of a locked file times out instead of hanging.
	if _, err := OpenBolt(path, BoltOptions{Timeout: 50 * time.Millisecond}); err == nil {
		t.Fatal("second OpenBolt of a locked file succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = OpenBolt(path, BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.GetPool(ctx, "p"); err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("pool after reopen: %+v, %v", got, err)
	}
	if got, err := s.GetAttachment(ctx, a.AttachmentKey); err != nil || !reflect.DeepEqual(got, a) {
		t.Fatalf("attachment after reopen: %+v, %v", got, err)
	}
	if v, err := s.GetMeta(ctx, "k", "x"); err != nil || string(v) != "v" {
		t.Fatalf("meta after reopen: %q, %v", v, err)
	}
	if bs, err := s.ListBlocks(ctx, "p"); err != nil || len(bs) != 1 || bs[0] != (Block{Pool: "p", Index: 3, Node: "n1"}) {
		t.Fatalf("blocks after reopen: %v, %v", bs, err)
	}
}

func TestConcurrentPutAttachment(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	withPool(t, s)
	const workers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				a := testAttachment("net", fmt.Sprintf("c-%d-%d", w, i))
				if err := s.PutAttachment(ctx, a); err != nil {
					errs <- err
				}
				// Every worker also races for one shared key: exactly one wins.
				if err := s.PutAttachment(ctx, testAttachment("net", fmt.Sprintf("shared-%d", i))); err != nil && !errors.Is(err, ErrExists) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	list, err := s.ListAttachments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != workers*each+each {
		t.Fatalf("got %d attachments, want %d", len(list), workers*each+each)
	}
}

func TestConcurrentClaimBlock(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	if err := s.CreatePool(ctx, testPool("p", "10.0.0.0/16"), nil); err != nil {
		t.Fatal(err)
	}
	const limit = 64
	var mu sync.Mutex
	owner := map[uint32]string{}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := fmt.Sprintf("n%d", w)
			for {
				b, err := s.ClaimBlock(ctx, "p", node, limit, nil, nil)
				if errors.Is(err, ErrExhausted) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if prev, dup := owner[b.Index]; dup {
					t.Errorf("block %d given to %s and %s", b.Index, prev, node)
				}
				owner[b.Index] = node
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(owner) != limit {
		t.Fatalf("%d blocks claimed, want %d", len(owner), limit)
	}
}

// TestAttachmentsOnly: with pools kept elsewhere (Kubernetes mode) an
// attachment is stored whatever its pool; by default a missing pool is
// refused.
func TestAttachmentsOnly(t *testing.T) {
	ctx := context.Background()
	a := Attachment{AttachmentKey: AttachmentKey{Network: "n", ContainerID: "c", IfName: "eth0"}, Pool: "from-the-api"}
	def, _ := openTest(t)
	if err := def.PutAttachment(ctx, a); !errors.Is(err, ErrNotFound) {
		t.Fatalf("default store, attachment of a missing pool: %v, want ErrNotFound", err)
	}
	only, err := OpenBolt(filepath.Join(t.TempDir(), "a.db"), BoltOptions{AttachmentsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	if err := only.PutAttachment(ctx, a); err != nil {
		t.Fatalf("AttachmentsOnly store: %v", err)
	}
	if got, err := only.GetAttachment(ctx, a.AttachmentKey); err != nil || got.Pool != a.Pool {
		t.Fatalf("read back: %+v, %v", got, err)
	}
}

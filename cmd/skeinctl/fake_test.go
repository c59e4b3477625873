package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/skeinnet/skein/api/rpc"
)

// fakeAdmin is an Admin server with canned data. It filters lists the way
// skeind does (exact matches), records the requests it gets, and fails a
// method with errs[method] when set.
type fakeAdmin struct {
	rpc.UnimplementedAdminServer

	pools       []*rpc.Pool
	blocks      []*rpc.Block
	attachments []*rpc.Attachment
	routes      *rpc.RouteList
	status      *rpc.DaemonStatus
	errs        map[string]error
	// hang makes Status block until the caller gives up.
	hang bool

	mu   sync.Mutex
	reqs []proto.Message
}

var _ rpc.AdminServer = (*fakeAdmin)(nil)

func (f *fakeAdmin) record(m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, proto.Clone(m))
}

// requests returns what the fake received, oldest first, and forgets it.
func (f *fakeAdmin) requests() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.reqs
	f.reqs = nil
	return r
}

func (f *fakeAdmin) CreatePool(_ context.Context, p *rpc.Pool) (*rpc.Pool, error) {
	f.record(p)
	if err := f.errs["CreatePool"]; err != nil {
		return nil, err
	}
	out := proto.Clone(p).(*rpc.Pool)
	if out.BlockSizeBits == 0 {
		out.BlockSizeBits = 5
	}
	return out, nil
}

func (f *fakeAdmin) GetPool(_ context.Context, r *rpc.PoolRef) (*rpc.Pool, error) {
	f.record(r)
	if err := f.errs["GetPool"]; err != nil {
		return nil, err
	}
	for _, p := range f.pools {
		if p.Name == r.Name {
			return p, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pool %q not found", r.Name)
}

func (f *fakeAdmin) ListPools(context.Context, *rpc.Empty) (*rpc.PoolList, error) {
	if err := f.errs["ListPools"]; err != nil {
		return nil, err
	}
	return &rpc.PoolList{Pools: f.pools}, nil
}

func (f *fakeAdmin) DeletePool(_ context.Context, r *rpc.PoolRef) (*rpc.Empty, error) {
	f.record(r)
	if err := f.errs["DeletePool"]; err != nil {
		return nil, err
	}
	return &rpc.Empty{}, nil
}

func (f *fakeAdmin) ListBlocks(_ context.Context, r *rpc.BlockFilter) (*rpc.BlockList, error) {
	f.record(r)
	var out []*rpc.Block
	for _, b := range f.blocks {
		if r.Pool == "" || r.Pool == b.Pool {
			out = append(out, b)
		}
	}
	return &rpc.BlockList{Blocks: out}, nil
}

func (f *fakeAdmin) ListAttachments(_ context.Context, r *rpc.AttachmentFilter) (*rpc.AttachmentList, error) {
	f.record(r)
	var out []*rpc.Attachment
	for _, a := range f.attachments {
		if (r.Network == "" || r.Network == a.Network) &&
			(r.Pool == "" || r.Pool == a.Pool) &&
			(r.ContainerId == "" || r.ContainerId == a.ContainerId) {
			out = append(out, a)
		}
	}
	return &rpc.AttachmentList{Attachments: out}, nil
}

func (f *fakeAdmin) ListRoutes(_ context.Context, r *rpc.Empty) (*rpc.RouteList, error) {
	f.record(r)
	if err := f.errs["ListRoutes"]; err != nil {
		return nil, err
	}
	return f.routes, nil
}

func (f *fakeAdmin) Status(ctx context.Context, _ *rpc.Empty) (*rpc.DaemonStatus, error) {
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if err := f.errs["Status"]; err != nil {
		return nil, err
	}
	return f.status, nil
}

// serve starts f on a UNIX socket in a temporary directory and returns the
// socket's path. The server stops when the test ends.
func serve(t *testing.T, f *fakeAdmin) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "skeind.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s := grpc.NewServer()
	rpc.RegisterAdminServer(s, f)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return sock
}

// cannedNow is the clock of every cli run and the time the canned data's
// ages count from, so an age cannot tick over between the two.
var cannedNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// cli runs skeinctl with args and env (SKEIN_SOCKET and nothing else).
func cli(env map[string]string, args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = runAt(args, &o, &e, func(k string) string { return env[k] }, func() time.Time { return cannedNow })
	return o.String(), e.String(), code
}

// Canned data. Container IDs are full 64-character IDs; two share a short prefix.
const (
	ctrA = "3f1c9a2b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
	ctrB = "9b8a7c6d5e4f30211f2e3d4c5b6a79881726354453627180f9e8d7c6b5a49382"
	ctrC = "9b8a00000000000000000000000000000000000000000000000000000000c0de"
)

func cannedAdmin() *fakeAdmin {
	now := cannedNow
	f := &fakeAdmin{
		pools: []*rpc.Pool{
			{Name: "default", Subnets: []string{"10.88.0.0/16"}, BlockSizeBits: 5,
				Reserved: []string{"10.88.0.1"}, CapacityV4: 65533, Used: 3, Blocks: 2},
			{Name: "dual", Subnets: []string{"10.99.0.0/24", "fd99::/48"}, BlockSizeBits: 6,
				CapacityV4: 254, CapacityV6: 1<<63 + 1<<62, Used: 1, Blocks: 1},
		},
		blocks: []*rpc.Block{
			{Pool: "default", Index: 0, Node: "node-a", Ipv4: "10.88.0.0/27", Used: 2, Size: 32},
			{Pool: "default", Index: 1, Node: "node-a", Ipv4: "10.88.0.32/27", Used: 1, Size: 32},
			{Pool: "dual", Index: 0, Node: "node-a", Ipv4: "10.99.0.0/26", Ipv6: "fd99::/122", Used: 1, Size: 64},
		},
		attachments: []*rpc.Attachment{
			{Network: "skein0", ContainerId: ctrA, Ifname: "eth0", Pool: "default",
				Addresses: []string{"10.88.0.2/16"}, Netns: "/var/run/netns/a", HostLink: "sk3f1c9a2b",
				Owner: "cni", Created: now.Add(-3 * time.Hour).Format(time.RFC3339), ContainerMac: "02:42:0a:58:00:02"},
			{Network: "skein0", ContainerId: ctrA, Ifname: "eth1", Pool: "dual",
				Addresses: []string{"10.99.0.2/24", "fd99::2/48"}, HostLink: "sk3f1c9a2c",
				Owner: "cni", Created: now.Add(-90 * time.Second).Format(time.RFC3339)},
			{Network: "backend", ContainerId: ctrB, Ifname: "eth0", Pool: "default",
				Addresses: []string{"10.88.0.34/16"}, Owner: "docker",
				Created: now.Add(-50 * time.Hour).Format(time.RFC3339)},
			{Network: "backend", ContainerId: ctrC, Ifname: "eth0", Pool: "default",
				Addresses: []string{"10.88.0.3/16"}, Owner: "docker"},
		},
		routes: &rpc.RouteList{Mode: "direct", Synced: true, Routes: []*rpc.Route{
			{Block: "10.88.0.64/27", Name: "default-2", Node: "node-b", NodeAddresses: []string{"192.0.2.2", "2001:db8::2"},
				Mode: "direct", Via: "192.0.2.2", Installed: true},
			{Block: "10.88.0.96/27", Name: "default-3", Node: "node-c", NodeAddresses: []string{"198.51.100.3"},
				Mode: "direct", Reason: "node address 198.51.100.3 is not on a directly connected network"},
		}},
		status: &rpc.DaemonStatus{Version: "v0.1.0", Node: "node-a", Store: "bbolt /var/lib/skein/skein.db",
			Uptime: "3h2m1s", Attachments: 4},
	}
	f.status.Pools = f.pools
	return f
}

package daemon

import (
	"context"
	"errors"
	"net/netip"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// adminServer is skeinctl's API.
type adminServer struct {
	rpc.UnimplementedAdminServer
	d *Daemon
}

// grpcError maps internal errors onto gRPC codes, keeping the message.
func grpcError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound), errors.Is(err, ipam.ErrPoolNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, store.ErrExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, ipam.ErrInvalidPool):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, store.ErrConflict):
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func (s *adminServer) poolMsg(ctx context.Context, p store.Pool) *rpc.Pool {
	m := &rpc.Pool{Name: p.Name, BlockSizeBits: uint32(p.BlockSizeBits), Reserved: p.Reserved}
	for _, sn := range p.Subnets {
		m.Subnets = append(m.Subnets, sn.String())
	}
	if u, err := s.d.ipam.Usage(ctx, p.Name); err == nil {
		m.CapacityV4, m.CapacityV6, m.Used, m.Blocks = u.CapacityV4, u.CapacityV6, u.Used, u.Blocks
	}
	return m
}

func (s *adminServer) CreatePool(ctx context.Context, in *rpc.Pool) (*rpc.Pool, error) {
	p := store.Pool{Name: in.Name, BlockSizeBits: int(in.BlockSizeBits), Reserved: in.Reserved}
	for _, sn := range in.Subnets {
		pr, err := netip.ParsePrefix(sn)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "subnet %q is not a CIDR: %v", sn, err)
		}
		p.Subnets = append(p.Subnets, pr)
	}
	p, err := s.d.ipam.CreatePool(ctx, p)
	if err != nil {
		return nil, grpcError(err)
	}
	s.d.log.Info("pool created", "pool", p.Name, "subnets", in.Subnets)
	return s.poolMsg(ctx, p), nil
}

func (s *adminServer) GetPool(ctx context.Context, in *rpc.PoolRef) (*rpc.Pool, error) {
	p, err := s.d.st.GetPool(ctx, in.Name)
	if err != nil {
		return nil, grpcError(err)
	}
	return s.poolMsg(ctx, p), nil
}

func (s *adminServer) ListPools(ctx context.Context, _ *rpc.Empty) (*rpc.PoolList, error) {
	pools, err := s.d.st.ListPools(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	out := &rpc.PoolList{}
	for _, p := range pools {
		out.Pools = append(out.Pools, s.poolMsg(ctx, p))
	}
	return out, nil
}

func (s *adminServer) DeletePool(ctx context.Context, in *rpc.PoolRef) (*rpc.Empty, error) {
	if err := s.d.ipam.DeletePool(ctx, in.Name); err != nil {
		return nil, grpcError(err)
	}
	s.d.log.Info("pool deleted", "pool", in.Name)
	return &rpc.Empty{}, nil
}

func (s *adminServer) ListBlocks(ctx context.Context, in *rpc.BlockFilter) (*rpc.BlockList, error) {
	blocks, err := s.d.st.ListBlocks(ctx, in.Pool)
	if err != nil {
		return nil, grpcError(err)
	}
	// Count use per block from the attachments.
	atts, err := s.d.st.ListAttachments(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	type bk struct {
		pool string
		i    uint32
	}
	used := map[bk]uint32{}
	geos := map[string]*ipam.Geometry{}
	geo := func(pool string) *ipam.Geometry {
		if g, ok := geos[pool]; ok {
			return g
		}
		_, g, _ := s.d.ipam.Pool(ctx, pool)
		geos[pool] = g
		return g
	}
	for _, a := range atts {
		g := geo(a.Pool)
		if g == nil {
			continue
		}
		for _, ad := range a.Addrs {
			if i, _, ok := g.Locate(ad); ok {
				used[bk{a.Pool, i}]++
			}
		}
	}
	out := &rpc.BlockList{}
	for _, b := range blocks {
		m := &rpc.Block{Pool: b.Pool, Index: b.Index, Node: b.Node, Used: used[bk{b.Pool, b.Index}]}
		if g := geo(b.Pool); g != nil && b.Index < g.Blocks() {
			v4, v6 := g.BlockPrefixes(b.Index)
			if v4.IsValid() {
				m.Ipv4 = v4.String()
				m.Size += g.BlockSize()
			}
			if v6.IsValid() {
				m.Ipv6 = v6.String()
				m.Size += g.BlockSize()
			}
		}
		out.Blocks = append(out.Blocks, m)
	}
	return out, nil
}

func attachmentMsg(a store.Attachment) *rpc.Attachment {
	m := &rpc.Attachment{
		Network: a.Network, ContainerId: a.ContainerID, Ifname: a.IfName, Pool: a.Pool,
		Netns: a.NetNS, HostLink: a.HostLink, Owner: a.Owner, ContainerMac: a.ContainerMAC,
		Created: a.Created.Format(time.RFC3339),
	}
	for _, ad := range a.Addrs {
		m.Addresses = append(m.Addresses, ad.String())
	}
	return m
}

func (s *adminServer) ListAttachments(ctx context.Context, in *rpc.AttachmentFilter) (*rpc.AttachmentList, error) {
	atts, err := s.d.st.ListAttachments(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	store.SortAttachments(atts)
	out := &rpc.AttachmentList{}
	for _, a := range atts {
		if in.Network != "" && a.Network != in.Network || in.Pool != "" && a.Pool != in.Pool || in.ContainerId != "" && a.ContainerID != in.ContainerId {
			continue
		}
		out.Attachments = append(out.Attachments, attachmentMsg(a))
	}
	return out, nil
}

func (s *adminServer) Status(ctx context.Context, _ *rpc.Empty) (*rpc.DaemonStatus, error) {
	pools, err := s.ListPools(ctx, &rpc.Empty{})
	if err != nil {
		return nil, err
	}
	sort.Slice(pools.Pools, func(i, j int) bool { return pools.Pools[i].Name < pools.Pools[j].Name })
	atts, err := s.d.st.ListAttachments(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	return &rpc.DaemonStatus{
		Version:     Version,
		Node:        s.d.cfg.Node,
		Store:       s.d.st.Describe(),
		Uptime:      time.Since(s.d.started).Round(time.Second).String(),
		Attachments: uint64(len(atts)),
		Pools:       pools.Pools,
	}, nil
}

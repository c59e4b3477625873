package docker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// PoolName is the skein pool created for a Docker network with a new
// --subnet: "docker-" and the first 12 characters of its ID (Docker's short
// ID), a valid pool name.
func PoolName(networkID string) string {
	id := strings.ToLower(networkID)
	if len(id) > 12 {
		id = id[:12]
	}
	return "docker-" + id
}

// createNetwork binds the pools RequestPool answered to the network and,
// when their subnets are new, creates the skein pool holding them all
// (IPv4 and IPv6 together, so the network is one dual-stack pool), with
// the gateways and aux addresses reserved.
func (d *Driver) createNetwork(ctx context.Context, r *createNetworkRequest) (retErr error) {
	if r.NetworkID == "" {
		return errors.New("NetworkID is required")
	}
	optPool, err := genericOptions(r.Options)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.o.Store.GetMeta(ctx, kindNetwork, r.NetworkID); err == nil {
		return fmt.Errorf("network %s already exists", r.NetworkID)
	}
	aps, err := d.matchPools(ctx, r)
	if err != nil {
		return err
	}

	// One skein pool for the whole network.
	var bound, pending []*addrPool
	for _, ap := range aps {
		if ap.Pool != "" {
			bound = append(bound, ap)
		} else {
			pending = append(pending, ap)
		}
	}
	n := network{ID: r.NetworkID, Created: time.Now().UTC()}
	switch {
	case len(bound) > 0 && len(pending) > 0:
		return fmt.Errorf("the network mixes skein pool %q (%s, chosen without --subnet) with the new subnet %s: give --subnet for every address family, or for none, or --ipam-opt %s=NAME",
			bound[0].Pool, bound[0].Subnet, pending[0].Subnet, OptPool)
	case len(bound) > 0:
		n.Pool = bound[0].Pool
		for _, ap := range bound[1:] {
			if ap.Pool != n.Pool {
				return fmt.Errorf("the network's subnets %s and %s are in two skein pools (%q, %q): a network uses one pool", bound[0].Subnet, ap.Subnet, n.Pool, ap.Pool)
			}
		}
		if optPool != "" && optPool != n.Pool {
			return fmt.Errorf("-o %s=%s, but Docker got its subnet %s from skein pool %q: add --ipam-opt %s=%s (Docker asks the IPAM driver for the subnet before it passes -o options to the network driver), or give a --subnet of pool %q",
				OptPool, optPool, bound[0].Subnet, n.Pool, OptPool, optPool, optPool)
		}
	default:
		if optPool != "" {
			return fmt.Errorf("-o %s=%s: subnet %s is not a subnet of that pool: give --ipam-opt %s=%s and a --subnet inside it, or none", OptPool, optPool, pending[0].Subnet, OptPool, optPool)
		}
		n.Pool, n.OwnsPool = PoolName(r.NetworkID), true
	}
	for _, ap := range aps {
		n.AddrPools = append(n.AddrPools, ap.ID)
	}

	// Bind first, so that a crash after the pool exists still leaves
	// records saying whose it is (ReleasePool deletes it then).
	bg := context.WithoutCancel(ctx)
	var saved []*addrPool
	defer func() {
		if retErr == nil {
			return
		}
		for _, ap := range saved {
			ap.Network = ""
			if ap.OwnsPool {
				ap.Pool, ap.OwnsPool = "", false
			}
			if err := putJSON(bg, d.o.Store, kindAddrPool, ap.ID, ap); err != nil {
				d.log.Error("docker: undo pool binding", "id", ap.ID, "err", err)
			}
		}
	}()
	for _, ap := range aps {
		ap.Network = r.NetworkID
		if n.OwnsPool {
			ap.Pool, ap.OwnsPool = n.Pool, true
		}
		if err := putJSON(ctx, d.o.Store, kindAddrPool, ap.ID, ap); err != nil {
			return err
		}
		saved = append(saved, ap)
	}
	if n.OwnsPool {
		if err := d.createPool(ctx, n.Pool, pending); err != nil {
			return err
		}
		defer func() {
			if retErr != nil {
				if err := d.o.IPAM.DeletePool(bg, n.Pool); err != nil {
					d.log.Error("docker: undo pool creation", "pool", n.Pool, "err", err)
				}
			}
		}()
	}
	if err := putJSON(ctx, d.o.Store, kindNetwork, n.ID, n); err != nil {
		return err
	}
	d.log.Info("docker: network created", "network", n.ID, "pool", n.Pool, "created", n.OwnsPool)
	return nil
}

// genericOptions reads the -o options skein knows; an unknown skein.*
// option is an error (a typo would otherwise be silently ignored).
func genericOptions(opts map[string]any) (pool string, err error) {
	g, _ := opts[optGeneric].(map[string]any)
	for k, v := range g {
		if !strings.HasPrefix(k, "skein.") {
			continue
		}
		s, _ := v.(string)
		switch k {
		case OptPool:
			if err := ipam.ValidateName(s); err != nil {
				return "", fmt.Errorf("-o %s: %w", OptPool, err)
			}
			pool = s
		default:
			return "", fmt.Errorf("unknown option -o %s (skein knows %s)", k, OptPool)
		}
	}
	return pool, nil
}

// matchPools finds the IPAM pool of each IPAMData entry. IPAMData does not
// carry the PoolID, so an unbound pool of the same address space, family
// and subnet is taken (the oldest: pools without --subnet share theirs).
func (d *Driver) matchPools(ctx context.Context, r *createNetworkRequest) ([]*addrPool, error) {
	all, err := listJSON[addrPool](ctx, d.o.Store, kindAddrPool)
	if err != nil {
		return nil, err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Requested.Before(all[j].Requested) })
	taken := map[string]bool{}
	var out []*addrPool
	for _, fam := range []struct {
		v6   bool
		data []ipamData
	}{{false, r.IPv4Data}, {true, r.IPv6Data}} {
		for _, in := range fam.data {
			sn, err := netip.ParsePrefix(in.Pool)
			if err != nil {
				return nil, fmt.Errorf("%s pool %q is not a CIDR", family(fam.v6), in.Pool)
			}
			var found *addrPool
			for i := range all {
				ap := &all[i]
				if !taken[ap.ID] && ap.Network == "" && ap.V6 == fam.v6 && ap.Subnet == sn && (in.AddressSpace == "" || in.AddressSpace == ap.AddressSpace) {
					found = ap
					break
				}
			}
			if found == nil {
				return nil, fmt.Errorf("subnet %s was not allocated by the skein IPAM driver: create skein networks with both -d and --ipam-driver naming skein", sn)
			}
			taken[found.ID] = true
			for _, aux := range in.AuxAddresses {
				if p, err := netip.ParsePrefix(aux); err == nil && !slices.Contains(found.Aux, p.Addr()) {
					found.Aux = append(found.Aux, p.Addr())
				}
			}
			out = append(out, found)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("the network has no IPv4 or IPv6 subnet")
	}
	return out, nil
}

// createPool makes the skein pool of a network with new subnets. Blocks are
// at most 32 addresses, fewer when a subnet is smaller.
func (d *Driver) createPool(ctx context.Context, name string, aps []*addrPool) error {
	p := store.Pool{Name: name, BlockSizeBits: ipam.DefaultBlockSizeBits}
	for _, ap := range aps {
		p.Subnets = append(p.Subnets, ap.Subnet)
		p.BlockSizeBits = min(p.BlockSizeBits, ap.Subnet.Addr().BitLen()-ap.Subnet.Bits())
		if ap.Gateway.IsValid() && ap.Subnet.Contains(ap.Gateway) {
			p.Reserved = append(p.Reserved, ap.Gateway.String())
		}
		for _, a := range ap.Aux {
			p.Reserved = append(p.Reserved, a.String())
		}
	}
	if p.BlockSizeBits < 1 {
		return fmt.Errorf("subnet too small: a skein pool needs at least 2 addresses per subnet")
	}
	if _, err := d.o.IPAM.CreatePool(ctx, p); err != nil {
		return fmt.Errorf("create skein pool %q: %w", name, err)
	}
	return nil
}

func (d *Driver) deleteNetwork(ctx context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, err := d.getNetwork(ctx, id)
	if err != nil {
		return err
	}
	atts, err := d.o.Store.ListAttachments(ctx)
	if err != nil {
		return err
	}
	// libnetwork deletes a network only once it has no endpoints left, so
	// any record still here is one Docker forgot: a CreateEndpoint that
	// failed on Docker's side (or whose answer a crash of skeind or
	// dockerd lost), which Docker never deletes, or a DeleteEndpoint that
	// failed and Docker only logged. Removed with the network, else they
	// would keep its pool, their links and addresses for ever.
	for _, a := range atts {
		if a.Network != endpointKey(id, "").Network {
			continue
		}
		if err := d.removeEndpoint(ctx, a); err != nil {
			return fmt.Errorf("network %s: endpoint %s Docker no longer has: %w", id, a.ContainerID, err)
		}
		d.log.Warn("docker: removed an endpoint Docker no longer has, with its network", "network", id, "endpoint", a.ContainerID)
	}
	if err := d.o.Store.PutMeta(ctx, kindNetwork, id, nil); err != nil {
		return err
	}
	d.log.Info("docker: network deleted", "network", id, "pool", n.Pool)
	if n.OwnsPool {
		return d.deletePoolIfUnused(ctx, n.Pool)
	}
	return nil
}

// createEndpoint records the endpoint and plumbs its routed veth pair,
// both ends in the node; Join hands the peer to Docker. The addresses are
// the ones Docker got from RequestAddress (held by their leases): the
// endpoint routes them but does not own them.
func (d *Driver) createEndpoint(ctx context.Context, r *createEndpointRequest) (_ *createEndpointResponse, retErr error) {
	if err := validIDs(r.NetworkID, r.EndpointID); err != nil {
		return nil, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	n, err := d.getNetwork(ctx, r.NetworkID)
	if err != nil {
		return nil, err
	}
	in := r.Interface
	if in == nil {
		in = &endpointInterface{}
	}
	var addrs []netip.Addr
	for _, s := range []string{in.Address, in.AddressIPv6} {
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("interface address %q is not a CIDR", s)
		}
		addrs = append(addrs, p.Addr().Unmap())
	}
	if len(addrs) == 0 {
		return nil, errors.New("the endpoint has no address: skein networks need --ipam-driver skein")
	}
	_, geo, err := d.o.IPAM.Pool(ctx, n.Pool)
	if err != nil {
		return nil, fmt.Errorf("skein pool %q of network %s: %w", n.Pool, n.ID, err)
	}
	for _, a := range addrs {
		if _, _, ok := geo.Locate(a); !ok {
			return nil, fmt.Errorf("address %s is not in skein pool %q of this network", a, n.Pool)
		}
	}
	var reply *createEndpointResponse
	mac, err := net.ParseMAC(in.MacAddress)
	if in.MacAddress == "" {
		mac = randomMAC()
		reply = &createEndpointResponse{Interface: &endpointInterface{MacAddress: mac.String()}}
	} else if err != nil {
		return nil, fmt.Errorf("MAC address %q: %w", in.MacAddress, err)
	}

	k := endpointKey(r.NetworkID, r.EndpointID)
	host, peer := linkNames(k)
	// The host veth's MAC is chosen here so that the record names the IPv6
	// gateway Join hands out: the host veth's link-local address.
	hostMAC := randomMAC()
	for bytes.Equal(hostMAC, mac) {
		hostMAC = randomMAC()
	}
	x := endpointExtra{Peer: peer}
	for _, a := range addrs {
		if a.Is6() {
			x.Gateway6 = dataplane.LinkLocal(hostMAC)
		}
	}
	extra, _ := json.Marshal(x)
	a := store.Attachment{
		AttachmentKey: k,
		Pool:          n.Pool,
		Addrs:         addrs,
		HostLink:      host,
		ContainerMAC:  mac.String(),
		Owner:         Owner,
		Borrowed:      true, // the leases own the addresses
		Created:       time.Now().UTC(),
		Extra:         extra,
	}
	unlock := d.endpoints.Lock(k.String())
	defer unlock()
	// The record first: a crash after plumbing leaves a link it claims
	// (reconcile would delete an unclaimed one, which is also safe).
	err = d.o.Store.PutAttachment(ctx, a)
	if errors.Is(err, store.ErrExists) {
		// Endpoint IDs are Docker's and never reused: a record under this
		// one is from an earlier CreateEndpoint of it that failed on
		// Docker's side, or whose answer a crash lost. Docker does not
		// delete such an endpoint; it may try again. The old one goes.
		old, gerr := d.o.Store.GetAttachment(ctx, k)
		if gerr == nil {
			gerr = d.removeEndpoint(ctx, old)
		}
		if gerr != nil {
			return nil, fmt.Errorf("endpoint %s already exists, and its remains cannot be removed: %w", r.EndpointID, gerr)
		}
		d.log.Warn("docker: endpoint created again; its earlier remains removed", "network", r.NetworkID, "endpoint", r.EndpointID)
		err = d.o.Store.PutAttachment(ctx, a)
	}
	if err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	defer func() {
		if retErr != nil {
			if err := d.o.Store.DeleteAttachment(bg, k); err != nil {
				d.log.Error("docker: undo endpoint record", "endpoint", r.EndpointID, "err", err)
			}
		}
	}()
	cfg := d.o.Dataplane.Config()
	if _, err := d.o.Dataplane.SetupPair(dataplane.Pair{
		HostName: host,
		PeerName: peer,
		Alias:    dataplane.AttachmentAlias(cfg.AliasPrefix, k.Network, k.ContainerID, k.IfName), // as the daemon's (reconcile retags with it)
		Addrs:    addrs,
		MTU:      d.o.MTU,
		PeerMAC:  mac,
		HostMAC:  hostMAC,
	}); err != nil {
		if errors.Is(err, dataplane.ErrInvalid) && in.MacAddress != "" {
			return nil, fmt.Errorf("plumb endpoint (MAC %s): %w", in.MacAddress, err)
		}
		return nil, fmt.Errorf("plumb endpoint: %w", err)
	}
	d.log.Info("docker: endpoint created", "network", r.NetworkID, "endpoint", r.EndpointID, "addrs", addrs, "host", host)
	return reply, nil
}

// endpoint returns the endpoint's record; an unknown one is an error.
func (d *Driver) endpoint(ctx context.Context, r *endpointRequest) (store.Attachment, error) {
	if err := validIDs(r.NetworkID, r.EndpointID); err != nil {
		return store.Attachment{}, err
	}
	a, err := d.o.Store.GetAttachment(ctx, endpointKey(r.NetworkID, r.EndpointID))
	if errors.Is(err, store.ErrNotFound) {
		return a, fmt.Errorf("unknown endpoint %s in network %s", r.EndpointID, r.NetworkID)
	}
	return a, err
}

func (d *Driver) endpointInfo(ctx context.Context, r *endpointRequest) (*endpointInfoResponse, error) {
	a, err := d.endpoint(ctx, r)
	if err != nil {
		return nil, err
	}
	return &endpointInfoResponse{Value: map[string]any{"skein.pool": a.Pool, "skein.hostLink": a.HostLink}}, nil
}

// join hands the peer to Docker, which moves it into the sandbox as
// eth<N>, sets its addresses with the network's mask, and then the routes
// returned here.
//
// The gateway is the dataplane's link-local one, outside every subnet
// (169.254.1.1; for IPv6 the endpoint's own, its host veth's link-local
// address):
// libnetwork programs a default route only via a gateway it can reach
// directly, so a connected route to it (a /32) comes with it. The
// subnet's on-link route the address brings is harmless for IPv4: the host
// veth answers ARP for every address (proxy ARP). IPv6 has no such switch,
// so the subnet is also routed, as its two halves (more specific than the
// on-link route), via the gateway: containers never solicit each other.
//
// A container on several skein networks gets the same IPv4 gateway on each
// interface (and, only from endpoints made before per-veth IPv6 gateways,
// the same IPv6 one); the kernel refuses a second identical connected route, so
// each later interface's is one bit shorter (/31, /30, …): still
// connected, still covering the gateway.
func (d *Driver) join(ctx context.Context, r *joinRequest) (*joinResponse, error) {
	a, err := d.endpoint(ctx, &endpointRequest{NetworkID: r.NetworkID, EndpointID: r.EndpointID})
	if err != nil {
		return nil, err
	}
	var x endpointExtra
	if err := json.Unmarshal(a.Extra, &x); err != nil || x.Peer == "" {
		_, x.Peer = linkNames(a.AttachmentKey)
	}
	gw6 := x.Gateway6
	if !gw6.IsValid() {
		gw6 = d.gw6 // an endpoint made when every host veth carried it
	}
	resp := &joinResponse{InterfaceName: &interfaceName{SrcName: x.Peer, DstPrefix: "eth"}}
	taken := sandboxRoutes(r.SandboxKey)
	for _, ad := range a.Addrs {
		if ad.Is4() {
			resp.Gateway = d.gw4.String()
			resp.StaticRoutes = append(resp.StaticRoutes, staticRoute{Destination: gatewayRoute(d.gw4, taken).String(), RouteType: routeConnected})
			continue
		}
		resp.GatewayIPv6 = gw6.String()
		resp.StaticRoutes = append(resp.StaticRoutes, staticRoute{Destination: gatewayRoute(gw6, taken).String(), RouteType: routeConnected})
		if sn := d.subnetOf(ctx, a, ad); sn.IsValid() && sn.Bits() < 128 {
			for _, h := range halves(sn) {
				resp.StaticRoutes = append(resp.StaticRoutes, staticRoute{Destination: h.String(), RouteType: routeNextHop, NextHop: gw6.String()})
			}
		}
	}
	return resp, nil
}

// subnetOf is the Docker subnet (the mask Docker puts on the container)
// that holds address ad of endpoint a.
func (d *Driver) subnetOf(ctx context.Context, a store.Attachment, ad netip.Addr) netip.Prefix {
	n, err := d.getNetwork(ctx, strings.TrimPrefix(a.Network, "docker:"))
	if err != nil {
		return netip.Prefix{}
	}
	for _, id := range n.AddrPools {
		if ap, err := d.getAddrPool(ctx, id); err == nil && ap.Subnet.Contains(ad) {
			return ap.Subnet
		}
	}
	return netip.Prefix{}
}

// halves splits p into its two halves.
func halves(p netip.Prefix) []netip.Prefix {
	p = p.Masked()
	b := p.Addr().AsSlice()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	hi, _ := netip.AddrFromSlice(b)
	return []netip.Prefix{netip.PrefixFrom(p.Addr(), p.Bits()+1), netip.PrefixFrom(hi, p.Bits()+1)}
}

// deleteEndpoint removes the pair (wherever Docker left the peer) and the
// record. The addresses stay leased until Docker's ReleaseAddress.
func (d *Driver) deleteEndpoint(ctx context.Context, r *endpointRequest) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if err := validIDs(r.NetworkID, r.EndpointID); err != nil {
		return err
	}
	defer d.endpoints.Lock(endpointKey(r.NetworkID, r.EndpointID).String())()
	a, err := d.endpoint(ctx, r)
	if err != nil {
		return err
	}
	if err := d.removeEndpoint(ctx, a); err != nil {
		return err
	}
	d.log.Info("docker: endpoint deleted", "network", r.NetworkID, "endpoint", r.EndpointID)
	return nil
}

// removeEndpoint tears down an endpoint's link (with its routes) and
// deletes its record; its addresses are the leases' (Borrowed).
func (d *Driver) removeEndpoint(ctx context.Context, a store.Attachment) error {
	if err := d.o.Dataplane.Teardown(a.HostLink, "", "", a.Addrs); err != nil {
		return fmt.Errorf("tear down endpoint %s: %w", a.ContainerID, err)
	}
	return d.o.Store.DeleteAttachment(ctx, a.AttachmentKey)
}

func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	_, _ = rand.Read(mac)
	mac[0] = mac[0]&^1 | 2
	return mac
}

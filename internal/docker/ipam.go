package docker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// OptPool names an existing skein pool, as --ipam-opt (seen by
// RequestPool) or -o (seen by CreateNetwork).
const OptPool = "skein.pool"

// staleAfter: an unbound pool older than this belongs to a network
// creation that never finished (dockerd died in between); it no longer
// blocks its subnet.
const staleAfter = 5 * time.Minute

// maxUnbound bounds RequestPool calls without --subnet that are not yet
// bound to a network. Docker repeats such a call, holding the previous
// answers, while the subnet overlaps a route of the host; since skein
// answers with the same pool each time that loop would never end.
const maxUnbound = 8

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// requestPool answers one family of a network Docker is creating.
//
//   - --ipam-opt skein.pool=NAME: the existing pool NAME; --subnet, if
//     given, must lie inside one of its subnets (addresses then come from
//     that part only).
//   - --subnet S equal to a subnet of a pool not made for another Docker
//     network (e.g. "default", or one made with skeinctl): that pool.
//   - --subnet S overlapping no pool: a new pool "docker-<network ID>",
//     created by CreateNetwork. Overlapping any other pool is an error.
//   - neither: the default pool.
func (d *Driver) requestPool(ctx context.Context, r *requestPoolRequest) (*requestPoolResponse, error) {
	if r.AddressSpace != LocalAddressSpace && r.AddressSpace != GlobalAddressSpace {
		return nil, fmt.Errorf("unknown address space %q: skein serves %q and %q", r.AddressSpace, LocalAddressSpace, GlobalAddressSpace)
	}
	ap := addrPool{ID: newID(), AddressSpace: r.AddressSpace, V6: r.V6, Requested: time.Now().UTC()}
	var err error
	if r.Pool != "" {
		if ap.Subnet, err = parseSubnet("subnet", r.Pool, r.V6); err != nil {
			return nil, err
		}
	}
	if r.SubPool != "" {
		if ap.Range, err = parseSubnet("ip-range", r.SubPool, r.V6); err != nil {
			return nil, err
		}
		if !ap.Subnet.IsValid() || !contains(ap.Subnet, ap.Range) {
			return nil, fmt.Errorf("ip-range %s is not inside subnet %s", ap.Range, ap.Subnet)
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	pools, err := d.o.Store.ListPools(ctx)
	if err != nil {
		return nil, err
	}
	others, err := listJSON[addrPool](ctx, d.o.Store, kindAddrPool)
	if err != nil {
		return nil, err
	}
	switch name := r.Options[OptPool]; {
	case name != "":
		p, ok := findPool(pools, name)
		if !ok {
			return nil, fmt.Errorf("skein pool %q does not exist", name)
		}
		sn, err := subnetFor(p, ap.Subnet, r.V6)
		if err != nil {
			return nil, err
		}
		ap.Pool = name
		if !ap.Subnet.IsValid() {
			ap.Subnet = sn
		}
	case ap.Subnet.IsValid():
		if err := d.placeSubnet(ctx, &ap, pools, others); err != nil {
			return nil, err
		}
	default:
		p, ok := findPool(pools, d.o.DefaultPool)
		if !ok {
			return nil, fmt.Errorf("no --subnet given and there is no skein pool %q: give --subnet, or --ipam-opt %s=NAME", d.o.DefaultPool, OptPool)
		}
		sn, err := subnetFor(p, netip.Prefix{}, r.V6)
		if err != nil {
			return nil, fmt.Errorf("%w: give an %s --subnet", err, family(r.V6))
		}
		unbound := 0
		for _, o := range others {
			if o.Pool == p.Name && o.V6 == r.V6 && o.Network == "" && time.Since(o.Requested) < staleAfter {
				unbound++
			}
		}
		if unbound >= maxUnbound {
			return nil, fmt.Errorf("subnet %s of skein pool %q was offered %d times without a network being created (does it overlap a route of the host?): give --subnet", sn, p.Name, unbound)
		}
		ap.Pool, ap.Subnet = p.Name, sn
	}
	if err := putJSON(ctx, d.o.Store, kindAddrPool, ap.ID, ap); err != nil {
		return nil, err
	}
	d.log.Info("docker: pool requested", "id", ap.ID, "subnet", ap.Subnet, "range", ap.Range, "skeinPool", ap.Pool)
	return &requestPoolResponse{PoolID: ap.ID, Pool: ap.Subnet.String(), Data: map[string]string{}}, nil
}

// placeSubnet decides where an explicit --subnet goes: an identical subnet
// of a pool not owned by a Docker network is reused; any other overlap is
// an error; otherwise the pool is created later, by CreateNetwork.
func (d *Driver) placeSubnet(ctx context.Context, ap *addrPool, pools []store.Pool, others []addrPool) error {
	owned := map[string]bool{}
	for _, o := range others {
		if o.OwnsPool && o.Pool != "" {
			owned[o.Pool] = true
		}
	}
	nets, err := listJSON[network](ctx, d.o.Store, kindNetwork)
	if err != nil {
		return err
	}
	for _, n := range nets {
		if n.OwnsPool {
			owned[n.Pool] = true
		}
	}
	for _, p := range pools {
		for _, sn := range p.Subnets {
			switch {
			case sn == ap.Subnet && !owned[p.Name]:
				ap.Pool = p.Name
				return nil
			case sn.Overlaps(ap.Subnet):
				hint := ""
				if !owned[p.Name] {
					hint = fmt.Sprintf(" (to use that pool, give --subnet %s or --ipam-opt %s=%s)", sn, OptPool, p.Name)
				}
				return fmt.Errorf("subnet %s overlaps subnet %s of skein pool %q%s", ap.Subnet, sn, p.Name, hint)
			}
		}
	}
	for _, o := range others {
		if o.Pool != "" || !o.Subnet.Overlaps(ap.Subnet) {
			continue
		}
		if o.Network == "" && time.Since(o.Requested) > staleAfter {
			d.log.Info("docker: dropping a stale pool request", "id", o.ID, "subnet", o.Subnet, "requested", o.Requested)
			if err := d.o.Store.PutMeta(ctx, kindAddrPool, o.ID, nil); err != nil {
				return err
			}
			continue
		}
		return fmt.Errorf("subnet %s overlaps subnet %s of another Docker network being created", ap.Subnet, o.Subnet)
	}
	return nil
}

// releasePool forgets a pool; addresses Docker still holds in it are
// released (Docker releases them first; this covers its failure paths).
// A skein pool created for the network goes with its last user.
func (d *Driver) releasePool(ctx context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ap, err := d.getAddrPool(ctx, id)
	if err != nil {
		return err
	}
	if err := d.releaseLeases(ctx, ap); err != nil {
		return err
	}
	if err := d.o.Store.PutMeta(ctx, kindAddrPool, id, nil); err != nil {
		return err
	}
	d.log.Info("docker: pool released", "id", id, "subnet", ap.Subnet, "skeinPool", ap.Pool)
	if ap.OwnsPool {
		return d.deletePoolIfUnused(ctx, ap.Pool)
	}
	return nil
}

func (d *Driver) releaseLeases(ctx context.Context, ap addrPool) error {
	atts, err := d.o.Store.ListAttachments(ctx)
	if err != nil {
		return err
	}
	for _, a := range atts {
		if a.Network != leaseKey(ap.ID, netip.Addr{}).Network {
			continue
		}
		d.log.Warn("docker: releasing an address still held at ReleasePool", "pool", ap.ID, "addrs", a.Addrs)
		if err := d.o.Store.DeleteAttachment(ctx, a.AttachmentKey); err != nil {
			return err
		}
		d.o.IPAM.Release(ctx, a.Pool, a.Addrs)
	}
	return nil
}

// deletePoolIfUnused deletes a skein pool made for a Docker network once
// no IPAM pool and no network refer to it any more. The caller holds mu.
func (d *Driver) deletePoolIfUnused(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	aps, err := listJSON[addrPool](ctx, d.o.Store, kindAddrPool)
	if err != nil {
		return err
	}
	nets, err := listJSON[network](ctx, d.o.Store, kindNetwork)
	if err != nil {
		return err
	}
	for _, o := range aps {
		if o.Pool == name {
			return nil
		}
	}
	for _, n := range nets {
		if n.Pool == name {
			return nil
		}
	}
	err = d.o.IPAM.DeletePool(ctx, name)
	if errors.Is(err, ipam.ErrPoolNotFound) {
		return nil
	}
	if err == nil {
		d.log.Info("docker: pool deleted", "pool", name)
	}
	return err
}

// requestAddress hands out one address. The gateway request is answered
// without taking a dynamic address: the --gateway given is reserved (or,
// in a pool shared with others, leased); without one, the answer is the
// dataplane's gateway: 169.254.1.1, the one containers really route
// through, and for IPv6 the dataplane's GatewayV6 (fe80::1) as the
// network's nominal gateway — each container really routes through its own
// host veth's link-local address, which Join returns. Before CreateNetwork, static requests are --aux-address
// values: they become reserved addresses of the pool to be created.
func (d *Driver) requestAddress(ctx context.Context, r *requestAddressRequest) (*requestAddressResponse, error) {
	var want netip.Addr
	if r.Address != "" {
		a, err := netip.ParseAddr(r.Address)
		if err != nil {
			return nil, fmt.Errorf("address %q is not an IP address", r.Address)
		}
		want = a.Unmap()
	}
	gateway := r.Options[optRequestAddrType] == addrTypeGateway

	// Leases only need the shared lock; the gateway and aux addresses
	// change the pool's record, which needs the exclusive one. Peek, lock,
	// then read again under the lock.
	ap, err := d.getAddrPool(ctx, r.PoolID)
	if err != nil {
		return nil, err
	}
	exclusive := gateway || ap.Pool == ""
	if exclusive {
		d.mu.Lock()
		defer d.mu.Unlock()
	} else {
		d.mu.RLock()
		defer d.mu.RUnlock()
	}
	if ap, err = d.getAddrPool(ctx, r.PoolID); err != nil {
		return nil, err
	}
	if want.IsValid() {
		if want.Is6() != ap.V6 {
			return nil, fmt.Errorf("address %s is not %s, as pool %s is", want, family(ap.V6), ap.Subnet)
		}
		if !ap.Subnet.Contains(want) {
			return nil, fmt.Errorf("address %s is not in subnet %s", want, ap.Subnet)
		}
	}
	reply := func(a netip.Addr) *requestAddressResponse {
		bits := ap.Subnet.Bits()
		if !ap.Subnet.Contains(a) {
			bits = a.BitLen()
		}
		return &requestAddressResponse{Address: netip.PrefixFrom(a, bits).String(), Data: map[string]string{}}
	}

	switch {
	case gateway:
		return d.requestGateway(ctx, &ap, want, reply)
	case ap.Pool == "" && !exclusive:
		return nil, fmt.Errorf("pool %s is being changed by a concurrent network operation: try again", ap.Subnet)
	case ap.Pool == "" && want.IsValid():
		// An aux address of a network being created: reserved in the
		// pool CreateNetwork makes.
		if !slices.Contains(ap.Aux, want) {
			ap.Aux = append(ap.Aux, want)
		}
		if err := putJSON(ctx, d.o.Store, kindAddrPool, ap.ID, ap); err != nil {
			return nil, err
		}
		return reply(want), nil
	case ap.Pool == "":
		return nil, fmt.Errorf("pool %s has no skein network yet: the skein IPAM driver serves networks of the skein network driver (docker network create -d skein --ipam-driver skein)", ap.Subnet)
	}
	a, err := d.lease(ctx, ap, want)
	if err != nil {
		return nil, err
	}
	return reply(a), nil
}

func (d *Driver) requestGateway(ctx context.Context, ap *addrPool, want netip.Addr, reply func(netip.Addr) *requestAddressResponse) (*requestAddressResponse, error) {
	if !want.IsValid() {
		want = d.gw4
		if ap.V6 {
			want = d.gw6
		}
	} else if ap.Pool != "" {
		// A pool shared with others (or named by skein.pool): the
		// gateway is held like any address.
		if _, err := d.lease(ctx, *ap, want); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		ap.GatewayLeased = true
	}
	ap.Gateway = want
	if err := putJSON(ctx, d.o.Store, kindAddrPool, ap.ID, *ap); err != nil {
		if ap.GatewayLeased {
			d.unlease(ctx, *ap, want)
		}
		return nil, err
	}
	return reply(want), nil
}

// lease allocates an address (want, or a free one in the pool's range)
// and records it durably before answering.
func (d *Driver) lease(ctx context.Context, ap addrPool, want netip.Addr) (netip.Addr, error) {
	req := ipam.Request{Pool: ap.Pool, IPv4: !ap.V6, IPv6: ap.V6}
	if want.IsValid() {
		req.Static = []netip.Addr{want}
	} else if ap.Range.IsValid() {
		req.Within = []netip.Prefix{ap.Range}
	} else if p, _, err := d.o.IPAM.Pool(ctx, ap.Pool); err == nil && !slices.Contains(p.Subnets, ap.Subnet) {
		req.Within = []netip.Prefix{ap.Subnet}
	}
	addrs, err := d.o.IPAM.Allocate(ctx, req)
	if err != nil {
		return netip.Addr{}, addressError(err, ap, want)
	}
	a := addrs[0]
	bg := context.WithoutCancel(ctx)
	if err := d.o.Store.PutAttachment(bg, store.Attachment{
		AttachmentKey: leaseKey(ap.ID, a),
		Pool:          ap.Pool,
		Addrs:         addrs,
		Owner:         Owner,
		Created:       time.Now().UTC(),
	}); err != nil {
		d.o.IPAM.Release(bg, ap.Pool, addrs)
		return netip.Addr{}, fmt.Errorf("record lease of %s: %w", a, err)
	}
	return a, nil
}

func (d *Driver) unlease(ctx context.Context, ap addrPool, a netip.Addr) {
	bg := context.WithoutCancel(ctx)
	if err := d.o.Store.DeleteAttachment(bg, leaseKey(ap.ID, a)); err != nil {
		d.log.Error("docker: undo lease", "addr", a, "err", err)
		return
	}
	d.o.IPAM.Release(bg, ap.Pool, []netip.Addr{a})
}

// addressError words ipam's errors for `docker run` users.
func addressError(err error, ap addrPool, want netip.Addr) error {
	where := ap.Subnet.String()
	if ap.Range.IsValid() && !want.IsValid() {
		where = "ip-range " + ap.Range.String()
	}
	switch {
	case errors.Is(err, ipam.ErrExhausted):
		return fmt.Errorf("no free %s address in %s (skein pool %q): %w", family(ap.V6), where, ap.Pool, err)
	case errors.Is(err, ipam.ErrInUse):
		return fmt.Errorf("address %s is already in use: %w", want, err)
	case errors.Is(err, ipam.ErrReserved):
		return fmt.Errorf("address %s is reserved (network, broadcast, gateway or aux address): %w", want, err)
	case errors.Is(err, ipam.ErrOutOfPool):
		return fmt.Errorf("address %s is not in skein pool %q: %w", want, ap.Pool, err)
	case errors.Is(err, ipam.ErrPoolNotFound):
		return fmt.Errorf("skein pool %q of this network no longer exists: %w", ap.Pool, err)
	}
	return err
}

// releaseAddress gives an address back. Releasing one not held succeeds:
// Docker retries and rolls back freely.
func (d *Driver) releaseAddress(ctx context.Context, r *releaseAddressRequest) error {
	a, err := netip.ParseAddr(strings.TrimSpace(r.Address))
	if err != nil {
		return fmt.Errorf("address %q is not an IP address", r.Address)
	}
	a = a.Unmap()
	// A lease needs only the shared lock; the gateway and aux addresses
	// live in the pool's record. Peek, lock, read again under the lock.
	ap, err := d.getAddrPool(ctx, r.PoolID)
	if err != nil {
		return err
	}
	if a == ap.Gateway || slices.Contains(ap.Aux, a) {
		d.mu.Lock()
		defer d.mu.Unlock()
	} else {
		d.mu.RLock()
		defer d.mu.RUnlock()
	}
	if ap, err = d.getAddrPool(ctx, r.PoolID); err != nil {
		return err
	}
	switch {
	case a == ap.Gateway:
		leased := ap.GatewayLeased
		ap.Gateway, ap.GatewayLeased = netip.Addr{}, false
		if err := putJSON(ctx, d.o.Store, kindAddrPool, ap.ID, ap); err != nil {
			return err
		}
		if !leased {
			return nil
		}
	case slices.Contains(ap.Aux, a) && ap.Pool == "":
		ap.Aux = slices.DeleteFunc(ap.Aux, func(x netip.Addr) bool { return x == a })
		return putJSON(ctx, d.o.Store, kindAddrPool, ap.ID, ap)
	}
	if _, err := d.o.Store.GetAttachment(ctx, leaseKey(ap.ID, a)); errors.Is(err, store.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if err := d.o.Store.DeleteAttachment(ctx, leaseKey(ap.ID, a)); err != nil {
		return err
	}
	d.o.IPAM.Release(ctx, ap.Pool, []netip.Addr{a})
	return nil
}

// --- helpers ---

func parseSubnet(what, s string, v6 bool) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, fmt.Errorf("%s %q is not a CIDR", what, s)
	}
	if p.Addr().Is4In6() {
		return p, fmt.Errorf("%s %s: use the plain IPv4 form", what, s)
	}
	if p != p.Masked() {
		return p, fmt.Errorf("%s %s has host bits set (did you mean %s?)", what, s, p.Masked())
	}
	if p.Addr().Is6() != v6 {
		return p, fmt.Errorf("%s %s is not %s", what, s, family(v6))
	}
	return p, nil
}

// contains reports whether inner lies inside outer.
func contains(outer, inner netip.Prefix) bool {
	return outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

func findPool(pools []store.Pool, name string) (store.Pool, bool) {
	for _, p := range pools {
		if p.Name == name {
			return p, true
		}
	}
	return store.Pool{}, false
}

// subnetFor returns the subnet of p (of the family) that holds want, or
// p's first subnet of the family when want is not given.
func subnetFor(p store.Pool, want netip.Prefix, v6 bool) (netip.Prefix, error) {
	var fam []netip.Prefix
	for _, sn := range p.Subnets {
		if sn.Addr().Is6() == v6 {
			fam = append(fam, sn)
		}
	}
	if len(fam) == 0 {
		return netip.Prefix{}, fmt.Errorf("skein pool %q has no %s subnet", p.Name, family(v6))
	}
	if !want.IsValid() {
		return fam[0], nil
	}
	for _, sn := range fam {
		if contains(sn, want) {
			return sn, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("subnet %s is not inside skein pool %q (subnets %v)", want, p.Name, fam)
}

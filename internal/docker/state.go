package docker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/skeinnet/skein/internal/store"
)

// Meta kinds in the store.
const (
	kindAddrPool = "docker-ipam-pool"
	kindNetwork  = "docker-network"
)

// addrPool is one pool Docker asked the IPAM driver for (RequestPool): one
// address family of one Docker network. Docker asks for pools, and for the
// gateway and aux addresses in them, before it names the network, so a
// pool starts unbound; CreateNetwork binds it to the network (and creates
// the skein pool if the subnet is new).
type addrPool struct {
	ID           string       `json:"id"`
	AddressSpace string       `json:"addressSpace"`
	V6           bool         `json:"v6"`
	Subnet       netip.Prefix `json:"subnet"`         // what Docker shows as the network's subnet
	Range        netip.Prefix `json:"range,omitzero"` // --ip-range: dynamic addresses come from here
	Pool         string       `json:"pool,omitempty"` // the skein pool; "" until CreateNetwork creates it
	OwnsPool     bool         `json:"ownsPool,omitempty"`
	Network      string       `json:"network,omitempty"` // Docker network ID, once CreateNetwork bound it
	// Gateway is the address answered for Docker's gateway request: the
	// --gateway (reserved in the pool) or the dataplane's gateway.
	Gateway netip.Addr `json:"gateway,omitzero"`
	// GatewayLeased: Gateway is held as a lease (a pool shared with
	// others cannot list it in its reserved addresses).
	GatewayLeased bool `json:"gatewayLeased,omitempty"`
	// Aux holds --aux-address values asked for before the skein pool
	// exists; they become reserved addresses of the pool.
	Aux       []netip.Addr `json:"aux,omitempty"`
	Requested time.Time    `json:"requested"`
}

// network is a Docker network of the skein driver.
type network struct {
	ID        string    `json:"id"`
	Pool      string    `json:"pool"`
	OwnsPool  bool      `json:"ownsPool,omitempty"`
	AddrPools []string  `json:"addrPools"`
	Created   time.Time `json:"created"`
}

// endpointExtra is kept in an endpoint attachment's Extra.
type endpointExtra struct {
	Peer string `json:"peer"`
	// Gateway6 is the endpoint's IPv6 gateway, its host veth's link-local
	// address; absent on endpoints made when every host veth carried the
	// dataplane's shared GatewayV6.
	Gateway6 netip.Addr `json:"gateway6,omitzero"`
}

func getJSON[T any](ctx context.Context, st store.Store, kind, key string) (T, error) {
	var v T
	b, err := st.GetMeta(ctx, kind, key)
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("decode %s %q: %w", kind, key, err)
	}
	return v, nil
}

func putJSON(ctx context.Context, st store.Store, kind, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return st.PutMeta(ctx, kind, key, b)
}

func listJSON[T any](ctx context.Context, st store.Store, kind string) ([]T, error) {
	m, err := st.ListMeta(ctx, kind)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(m))
	for k, b := range m {
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("decode %s %q: %w", kind, k, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func (d *Driver) getAddrPool(ctx context.Context, id string) (addrPool, error) {
	if id == "" {
		return addrPool{}, errors.New("PoolID is required")
	}
	p, err := getJSON[addrPool](ctx, d.o.Store, kindAddrPool, id)
	if errors.Is(err, store.ErrNotFound) {
		return p, fmt.Errorf("unknown IPAM pool %q (not requested from skein, or already released)", id)
	}
	return p, err
}

func (d *Driver) getNetwork(ctx context.Context, id string) (network, error) {
	if id == "" {
		return network{}, errors.New("NetworkID is required")
	}
	n, err := getJSON[network](ctx, d.o.Store, kindNetwork, id)
	if errors.Is(err, store.ErrNotFound) {
		return n, fmt.Errorf("unknown network %q (not a skein network, or already deleted)", id)
	}
	return n, err
}

// Keys of store attachments. ':' cannot appear in a CNI network name, so
// these never collide with a CNI attachment.

func endpointKey(networkID, endpointID string) store.AttachmentKey {
	return store.AttachmentKey{Network: "docker:" + networkID, ContainerID: endpointID, IfName: "eth"}
}

func leaseKey(poolID string, a netip.Addr) store.AttachmentKey {
	return store.AttachmentKey{Network: "docker-ipam:" + poolID, ContainerID: a.String(), IfName: "ipam"}
}

// linkNames derives the host veth and the peer Docker moves: stable, so
// DeleteEndpoint finds them from the IDs alone, and short enough for
// IFNAMSIZ.
func linkNames(k store.AttachmentKey) (host, peer string) {
	h := sha256.Sum256([]byte(k.Network + "\x00" + k.ContainerID))
	s := hex.EncodeToString(h[:6])
	return "sk" + s, "skd" + s
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validIDs(networkID, endpointID string) error {
	switch {
	case networkID == "":
		return errors.New("NetworkID is required")
	case endpointID == "":
		return errors.New("EndpointID is required")
	}
	return nil
}

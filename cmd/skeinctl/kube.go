package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/api/rpc"
	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// In Kubernetes mode (skeind --store kubernetes) the cluster's pools and
// blocks live in the API server as AddressPool and AddressBlock objects:
// `pool list`, `pool show` and `block list` read them there when a
// kubeconfig is given (--kubeconfig, or $KUBECONFIG unless --socket is),
// and print them as they print skeind's answers. Attachments and the
// daemon's status belong to one node: they always come from its skeind.
//
// What the API does not hold is left out: a pool's addresses in use are
// known only if its status reports them, a block's never (nodes keep
// their attachments locally).

// errNotFound ends the message for an object the API server does not have.
var errNotFound = errors.New("not found")

// useKube reports whether pools and blocks come from the API server.
func (a *app) useKube() bool {
	if a.kubeconfig != "" {
		return true
	}
	return a.getenv("KUBECONFIG") != "" && !a.socketSet
}

// withKube runs call with a client of the API server and a context bounded
// by --timeout, and says which server an error came from.
func (a *app) withKube(ctx context.Context, call func(context.Context, client.Reader) error) error {
	cfg, err := a.restConfig()
	if err != nil {
		return err
	}
	cfg.Timeout = a.timeout
	scheme := runtime.NewScheme()
	if err := skeinv1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connect to the API server at %s: %w", cfg.Host, err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if err := call(ctx, c); err != nil {
		if errors.Is(err, errNotFound) {
			return err
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("the API server at %s did not answer within %s", cfg.Host, a.timeout)
		}
		return fmt.Errorf("API server at %s: %w", cfg.Host, err)
	}
	return nil
}

// restConfig loads the kubeconfig: --kubeconfig, else the files listed in
// $KUBECONFIG (merged as kubectl merges them).
func (a *app) restConfig() (*rest.Config, error) {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: a.kubeconfig}
	if a.kubeconfig == "" {
		rules.Precedence = filepath.SplitList(a.getenv("KUBECONFIG"))
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return cfg, nil
}

// kubePools lists the pools with their blocks counted.
func kubePools(ctx context.Context, c client.Reader) ([]*rpc.Pool, error) {
	var pools skeinv1.AddressPoolList
	if err := c.List(ctx, &pools); err != nil {
		return nil, fmt.Errorf("list AddressPools: %w", err)
	}
	var blocks skeinv1.AddressBlockList
	if err := c.List(ctx, &blocks); err != nil {
		return nil, fmt.Errorf("list AddressBlocks: %w", err)
	}
	perPool := map[string]uint32{}
	for _, b := range blocks.Items {
		perPool[b.Labels[skeinv1.LabelPool]]++
	}
	out := make([]*rpc.Pool, 0, len(pools.Items))
	for i := range pools.Items {
		out = append(out, poolFromAPI(&pools.Items[i], perPool[pools.Items[i].Name]))
	}
	slices.SortFunc(out, func(x, y *rpc.Pool) int { return cmp.Compare(x.Name, y.Name) })
	return out, nil
}

// kubePool reads one pool and counts its blocks.
func kubePool(ctx context.Context, c client.Reader, name string) (*rpc.Pool, error) {
	var p skeinv1.AddressPool
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("pool %q %w", name, errNotFound)
		}
		return nil, fmt.Errorf("get AddressPool %s: %w", name, err)
	}
	var blocks skeinv1.AddressBlockList
	if err := c.List(ctx, &blocks, client.MatchingLabels{skeinv1.LabelPool: name}); err != nil {
		return nil, fmt.Errorf("list AddressBlocks of pool %s: %w", name, err)
	}
	return poolFromAPI(&p, uint32(len(blocks.Items))), nil
}

// poolFromAPI is p as skeind describes a pool. The capacity is the
// controller's block arithmetic, so it is what the controller can carve.
func poolFromAPI(p *skeinv1.AddressPool, blocks uint32) *rpc.Pool {
	out := &rpc.Pool{
		Name:          p.Name,
		BlockSizeBits: uint32(p.Spec.BlockSizeBits),
		Reserved:      p.Spec.Reserved,
		Blocks:        blocks,
	}
	for _, s := range p.Spec.Subnets {
		for _, sub := range []*string{s.IPv4, s.IPv6} {
			if sub != nil {
				out.Subnets = append(out.Subnets, *sub)
			}
		}
	}
	if p.Status.AddressesUsed != nil && *p.Status.AddressesUsed > 0 {
		out.Used = uint64(*p.Status.AddressesUsed)
	}
	// A pool the webhook never saw may make no geometry: no capacity.
	if g, err := p.Geometry(); err == nil {
		per := uint64(g.BlockSize()) * uint64(g.Blocks())
		if v4, v6 := g.Families(); v4 {
			out.CapacityV4 = per
			if v6 {
				out.CapacityV6 = per
			}
		} else if v6 {
			out.CapacityV6 = per
		}
	}
	return out
}

// kubeBlocks lists the blocks, of one pool if pool is not empty, ordered
// by pool and index.
func kubeBlocks(ctx context.Context, c client.Reader, pool string) ([]*rpc.Block, error) {
	var opts []client.ListOption
	if pool != "" {
		opts = append(opts, client.MatchingLabels{skeinv1.LabelPool: pool})
	}
	var blocks skeinv1.AddressBlockList
	if err := c.List(ctx, &blocks, opts...); err != nil {
		return nil, fmt.Errorf("list AddressBlocks: %w", err)
	}
	out := make([]*rpc.Block, 0, len(blocks.Items))
	for _, b := range blocks.Items {
		rb := &rpc.Block{
			Pool:  b.Labels[skeinv1.LabelPool],
			Index: uint32(b.Index),
			Node:  b.Labels[skeinv1.LabelNode],
		}
		if b.IPv4 != nil {
			rb.Ipv4 = *b.IPv4
			rb.Size = prefixSize(*b.IPv4)
		}
		if b.IPv6 != nil {
			rb.Ipv6 = *b.IPv6
			if rb.Size == 0 {
				rb.Size = prefixSize(*b.IPv6)
			}
		}
		out = append(out, rb)
	}
	slices.SortFunc(out, func(x, y *rpc.Block) int {
		return cmp.Or(cmp.Compare(x.Pool, y.Pool), cmp.Compare(x.Index, y.Index))
	})
	return out, nil
}

// prefixSize is the number of addresses of a block's CIDR (0 if it is not
// one, or holds more than 2^31: no block is that large).
func prefixSize(cidr string) uint32 {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return 0
	}
	host := p.Addr().BitLen() - p.Bits()
	if host > 31 {
		return 0
	}
	return 1 << host
}

// kubeWriteRefused is the answer to a pool change in Kubernetes mode:
// pools are API objects there, changed with kubectl and checked by the
// controller's webhook.
func (a *app) kubeWriteRefused(what string) error {
	return usagef("%s: pools of a cluster are AddressPool objects, changed with kubectl (kubectl apply -f pool.yaml); "+
		"to change skeind's own store, give --socket", what)
}

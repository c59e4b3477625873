package routebench

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// Simulated nodes: Node objects whose InternalIPs lie in simUnderlay
// (addresses no namespace holds: direct mode finds them on-link, vxlan
// mode makes an FDB entry for each), and
// AddressBlocks of the pool simPool labelled with them, all made through
// the API as the controller would make them. No skeind runs for them.
const (
	simPool = "sim"
	simBits = 4 // blocks of 16 addresses
)

var simSubnet = netip.MustParsePrefix("10.128.0.0/12")

// probeNode owns the blocks the convergence benchmark times; a simulated
// node too (a Node object, no skeind).
const probeNode = "probe"

var probeAddr = simAddr(0)

// simNodeName and simNodeAddr name the i-th simulated node (0-based).
func simNodeName(i int) string      { return fmt.Sprintf("sim-%04d", i) }
func simNodeAddr(i int) netip.Addr  { return simAddr(10 + i) }
func simBlockName(index int) string { return skeinv1.BlockName(simPool, uint32(index)) }
func simBlockPrefix(index int) netip.Prefix {
	a := simSubnet.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(index) << simBits
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 32-simBits)
}

// simBlock is the AddressBlock of index in simPool owned by node.
func simBlock(index int, node string) *skeinv1.AddressBlock {
	return &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: simBlockName(index),
			Labels: map[string]string{skeinv1.LabelPool: simPool, skeinv1.LabelNode: node}},
		Index: int64(index),
		IPv4:  ptr.To(simBlockPrefix(index).String()),
	}
}

// createSimPool makes the AddressPool the simulated blocks belong to.
func createSimPool(ctx context.Context, c client.Client) error {
	return c.Create(ctx, &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: simPool},
		Spec: skeinv1.AddressPoolSpec{BlockSizeBits: simBits,
			Subnets: []skeinv1.SubnetSet{{IPv4: ptr.To(simSubnet.String())}}},
	})
}

// createSims makes simulated nodes from..to-1, each with perNode blocks
// (node i holds indexes i*perNode...), through a client without a tight
// client-side rate limit, workers requests at a time: the Nodes first (a
// block whose node is unknown is reported, not routed), then the blocks.
func createSims(ctx context.Context, env *kube.Env, from, to, perNode, workers int) error {
	cfg := *env.Config
	cfg.QPS, cfg.Burst = 5000, 10000
	c, err := kube.NewClient(&cfg)
	if err != nil {
		return err
	}
	var nodes, blocks []client.Object
	for i := from; i < to; i++ {
		nodes = append(nodes, nodeObject(simNodeName(i), simNodeAddr(i)))
		for k := range perNode {
			blocks = append(blocks, simBlock(i*perNode+k, simNodeName(i)))
		}
	}
	if err := createAll(ctx, c, nodes, workers); err != nil {
		return err
	}
	return createAll(ctx, c, blocks, workers)
}

// createAll creates objs, workers at a time, and returns the first error.
func createAll(ctx context.Context, c client.Client, objs []client.Object, workers int) error {
	jobs := make(chan client.Object)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range workers {
		wg.Go(func() {
			for obj := range jobs {
				if err := c.Create(ctx, obj); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("create %s: %w", obj.GetName(), err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for _, o := range objs {
		jobs <- o
	}
	close(jobs)
	wg.Wait()
	return first
}

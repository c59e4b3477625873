package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

func init() { ctrl.SetLogger(logr.Discard()) }

// startAll runs a manager with every reconciler (Setup) until the test
// ends, without leader election. The manager must stop within its
// grace period, like the binary's.
func startAll(t *testing.T, env *kube.Env, opts Options) {
	t.Helper()
	kube.StartManager(t, env, func(mgr ctrl.Manager) error { return Setup(mgr, opts) })
}

// eventually waits up to 30 s for cond to return "".
func eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	kube.Eventually(t, 30*time.Second, what, cond)
}

func newPool(name string, bits int32, subnets ...skeinv1.SubnetSet) *skeinv1.AddressPool {
	return &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       skeinv1.AddressPoolSpec{Subnets: subnets, BlockSizeBits: bits},
	}
}

func getPool(t *testing.T, c client.Client, name string) *skeinv1.AddressPool {
	t.Helper()
	p := &skeinv1.AddressPool{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// poolState sums up what the tests check of a pool's status.
func poolState(p *skeinv1.AddressPool) string {
	cond := func(typ string) string {
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		if c == nil {
			return typ + "=?"
		}
		return fmt.Sprintf("%s=%s/%s", typ, c.Status, c.Reason)
	}
	return fmt.Sprintf("%d/%d %s %s", p.Status.BlocksAllocated, p.Status.BlocksTotal, cond(PoolReady), cond(PoolExhausted))
}

// makeBlock is block idx of pool as a node's skeind claims it: named
// <pool>-<idx>, owned by node (nodeName), labelled with both, owned by
// the pool, held by FinalizerBlock. oldProtocol makes it as the retired
// BlockRequest reconciler did: the owner only in the label.
func makeBlock(t *testing.T, c client.Client, pool string, idx uint32, node string, oldProtocol bool) *skeinv1.AddressBlock {
	t.Helper()
	p := getPool(t, c, pool)
	blk := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{
			Name:       skeinv1.BlockName(pool, idx),
			Labels:     map[string]string{skeinv1.LabelPool: pool, skeinv1.LabelNode: node},
			Finalizers: []string{skeinv1.FinalizerBlock},
		},
		Index: int64(idx),
	}
	if oldProtocol {
		blk.Labels[skeinv1.LabelRequest] = "0c4d9e5e-0000-4000-8000-" + fmt.Sprintf("%012d", idx)
	} else {
		blk.NodeName = node
	}
	g, err := p.Geometry()
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := g.BlockPrefixes(idx)
	if v4.IsValid() {
		blk.IPv4 = ptr.To(v4.String())
	}
	if v6.IsValid() {
		blk.IPv6 = ptr.To(v6.String())
	}
	if err := controllerutil.SetControllerReference(p, blk, kube.Scheme); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), blk); err != nil {
		t.Fatalf("create block %s: %v", blk.Name, err)
	}
	return blk
}

// freeBlock does what a node's skeind does when it lets a block go.
func freeBlock(t *testing.T, c client.Client, name string) {
	t.Helper()
	ctx := context.Background()
	blk := &skeinv1.AddressBlock{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, blk); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, blk); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, blk); err != nil {
		t.Fatal(err)
	}
	controllerutil.RemoveFinalizer(blk, skeinv1.FinalizerBlock)
	if err := c.Update(ctx, blk); err != nil {
		t.Fatal(err)
	}
}

func blocksOf(c client.Client, t *testing.T, pool string) []skeinv1.AddressBlock {
	t.Helper()
	var l skeinv1.AddressBlockList
	if err := c.List(context.Background(), &l, client.MatchingLabels{skeinv1.LabelPool: pool}); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// exists reports whether obj (by name and namespace) is still in the API.
func exists(t *testing.T, c client.Client, obj client.Object) bool {
	t.Helper()
	err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// request makes a BlockRequest of the retired protocol, as an old skeind
// would.
func request(c client.Client, t *testing.T, node, pool string) *skeinv1.BlockRequest {
	t.Helper()
	br := &skeinv1.BlockRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-"},
		Spec:       skeinv1.BlockRequestSpec{NodeName: node, PoolName: pool},
	}
	if err := c.Create(context.Background(), br); err != nil {
		t.Fatalf("create request: %v", err)
	}
	return br
}

// leaseNamespace makes DefaultLeaseNamespace, where the tests' nodes
// keep their Leases.
func leaseNamespace(t *testing.T, c client.Client) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultLeaseNamespace}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

// renewLease writes node's liveness Lease as skeind does, renewed at
// renewed (the node's clock) for duration.
func renewLease(t *testing.T, c client.Client, node string, renewed time.Time, duration time.Duration) *coordinationv1.Lease {
	t.Helper()
	l, err := writeLease(c, node, renewed, duration)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func writeLease(c client.Client, node string, renewed time.Time, duration time.Duration) (*coordinationv1.Lease, error) {
	ctx := context.Background()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: DefaultLeaseNamespace, Name: skeinv1.NodeLeaseName(node)}}
	err := c.Get(ctx, client.ObjectKeyFromObject(l), l)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	l.Spec = coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(node),
		LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
		RenewTime:            &metav1.MicroTime{Time: renewed},
	}
	if apierrors.IsNotFound(err) {
		err = c.Create(ctx, l)
	} else {
		err = c.Update(ctx, l)
	}
	if err != nil {
		return nil, fmt.Errorf("write Lease of %s: %w", node, err)
	}
	return l, nil
}

// counter is the value of a counter of this package's metrics.
func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

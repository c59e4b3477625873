// Package identity checks skein's per-node identity against a real
// kube-apiserver (test/kube): with the RBAC and the admission policies of
// deploy/kubernetes as shipped, skeind's service account holding a token
// bound to a pod on node n1 (what the kubelet mounts into skeind's pod)
// may claim, free and adopt n1's AddressBlocks, annotate n1's Node and
// renew n1's Lease, and nothing of node n2's; credentials of that account
// naming no node write nothing.
//
// Every request is made twice: first with the policies created but not
// bound, where each must succeed (RBAC alone lets skeind do it, so a
// refusal below is the policies' doing and the test can fail), then with
// the bindings, where each gets the verdict of its row.
package identity

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/cluster"
	"github.com/skeinnet/skein/test/kube"
)

const (
	namespace = "skein-system"
	account   = "skeind"
	// user is skeind's account as the API server names it; a static
	// token user of that name stands for a credential naming no node.
	user = "system:serviceaccount:" + namespace + ":" + account
	// me is the node of skeind's token, other another node.
	me, other = "n1", "n2"
)

// Who makes a row's request, as skeind's account.
const (
	bound   = "pod-bound token (node n1)"
	unbound = "token bound to nothing"
	static  = "static token"
)

// fixture is one row's world in one phase: its blocks belong to its own
// pool (label and name prefix), so rows and phases never share a block.
type fixture struct {
	admin client.Client
	pool  string // "<phase>-<row>"
	phase string // "off" or "on": in values that must differ between phases
}

// block is <pool>-<index> of f's pool, owned by nodeName (none if "")
// and labelled node (no label if ""), with skeind's finalizer.
func (f *fixture) block(index int64, nodeName, node string) *skeinv1.AddressBlock {
	b := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{
			Name:       fmt.Sprintf("%s-%d", f.pool, index),
			Labels:     map[string]string{skeinv1.LabelPool: f.pool},
			Finalizers: []string{skeinv1.FinalizerBlock},
		},
		NodeName: nodeName,
		Index:    index,
		IPv4:     ptr.To(fmt.Sprintf("10.0.%d.0/28", index)),
	}
	if node != "" {
		b.Labels[skeinv1.LabelNode] = node
	}
	return b
}

func (f *fixture) name(index int64) string { return fmt.Sprintf("%s-%d", f.pool, index) }

type row struct {
	name string
	as   string // bound, unbound or static
	// setup runs as the admin before the request.
	setup func(ctx context.Context, f *fixture) error
	// do makes the request(s) as skeind with c.
	do func(ctx context.Context, f *fixture, c client.Client) error
	// allowed with the policies bound; else refused by the policy whose
	// message holds want.
	allowed bool
	want    string
	// crd: the CRD's own validation refuses the request (its message
	// holds want) with or without the policies.
	crd bool
}

func TestNodeIdentity(t *testing.T) {
	env := kube.Start(t, kube.Options{Users: []kube.User{{Name: user}}})
	ctx := context.Background()
	admin, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	create(ctx, t, admin, cluster.Manifests(t, "namespace.yaml"))
	create(ctx, t, admin, cluster.Manifests(t, "skeind-rbac.yaml"))
	bindings, policies := split(cluster.Manifests(t, "skeind-policy.yaml"))
	if len(bindings) == 0 || len(policies) == 0 {
		t.Fatalf("skeind-policy.yaml holds %d bindings and %d other objects", len(bindings), len(policies))
	}
	create(ctx, t, admin, policies)
	// Its type checker writes each policy's status: an expression naming
	// a field the kind lacks would otherwise only fail when evaluated.
	env.StartControllerManager(t, "validatingadmissionpolicy-status-controller")
	if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: other}}); err != nil {
		t.Fatal(err)
	}
	clients := map[string]client.Client{}
	for as, cfg := range map[string]func() string{
		bound:   func() string { return env.NodeToken(t, namespace, account, me) },
		unbound: func() string { return env.ServiceAccountToken(t, namespace, account) },
	} {
		if clients[as], err = kube.NewClient(env.TokenConfig(cfg())); err != nil {
			t.Fatal(err)
		}
	}
	if clients[static], err = kube.NewClient(env.UserConfig(user)); err != nil {
		t.Fatal(err)
	}

	rows := slices.Concat(blockRows(), nodeRows(), leaseRows(), noNodeRows())
	run := func(t *testing.T, phase string, enforced bool) {
		for i, r := range rows {
			t.Run(r.name+" as "+r.as, func(t *testing.T) {
				f := &fixture{admin: admin, pool: fmt.Sprintf("%s-%d", phase, i), phase: phase}
				if r.setup != nil {
					if err := r.setup(ctx, f); err != nil {
						t.Fatalf("setup: %v", err)
					}
				}
				err := r.do(ctx, f, clients[r.as])
				switch {
				case r.crd:
					if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), r.want) {
						t.Errorf("got %v; want the CRD's refusal %q", err, r.want)
					}
				case !enforced || r.allowed:
					if err != nil {
						t.Errorf("refused: %v", err)
					}
				case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'skeind-own-") ||
					!strings.Contains(err.Error(), r.want):
					t.Errorf("got %v; want refused by a skeind-own- policy with %q", err, r.want)
				default:
					t.Logf("refused: %v", err)
				}
			})
		}
	}

	t.Run("without the bindings", func(t *testing.T) { run(t, "off", false) })
	if t.Failed() {
		t.Fatal("RBAC refuses what skeind must be able to do, or the policies act unbound")
	}
	checkTypes(ctx, t, admin, policyNames(policies))
	create(ctx, t, admin, bindings)
	waitEnforced(ctx, t, admin, clients[static])
	t.Run("with the bindings", func(t *testing.T) { run(t, "on", true) })
}

// waitEnforced waits until each policy refuses a request of c, skeind's
// account with a credential naming no node (every policy's first rule):
// the API server picks bindings up from a watch.
func waitEnforced(ctx context.Context, t *testing.T, admin, c client.Client) {
	t.Helper()
	probes := map[string]func(try int) error{
		"blocks": func(try int) error {
			b := &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", try),
				Labels: map[string]string{skeinv1.LabelPool: "probe", skeinv1.LabelNode: other}}, NodeName: other, Index: int64(try)}
			err := c.Create(ctx, b)
			if err == nil {
				_ = admin.Delete(ctx, b)
				return fmt.Errorf("a block for %s was made", other)
			}
			return forbidden(err)
		},
		"node": func(try int) error {
			return forbidden(mergePatch(ctx, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: other}},
				fmt.Sprintf(`{"metadata":{"annotations":{"test.skein.dev/probe":"%d"}}}`, try)))
		},
		"lease": func(try int) error {
			l := lease(fmt.Sprintf("skein-probe-%d", try), me)
			err := c.Create(ctx, l)
			if err == nil {
				_ = admin.Delete(ctx, l)
				return fmt.Errorf("lease %s was made", l.Name)
			}
			return forbidden(err)
		},
	}
	for what, probe := range probes {
		if err := waitUntil(ctx, "the "+what+" policy is not enforced", probe); err != nil {
			t.Fatal(err)
		}
	}
}

func forbidden(err error) error {
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
		return nil
	}
	return fmt.Errorf("not refused by a policy: %v", err)
}

// mergePatch sends a JSON merge patch of obj.
func mergePatch(ctx context.Context, c client.Client, obj client.Object, patch string) error {
	return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(patch)))
}

package kube

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// TestAssetsDirMatchesScript keeps the versions here and the ones
// scripts/deps.d/k8s.sh builds in step.
func TestAssetsDirMatchesScript(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "scripts", "deps.d", "k8s.sh"))
	if err != nil {
		t.Fatal(err)
	}
	want := "local k8s=" + KubernetesVersion + " etcd=" + EtcdVersion
	if !strings.Contains(string(b), want) {
		t.Errorf("scripts/deps.d/k8s.sh does not set %q: the script and test/kube disagree on versions", want)
	}
}

func pool(name string, bits int32, subnets ...skeinv1.SubnetSet) *skeinv1.AddressPool {
	return &skeinv1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       skeinv1.AddressPoolSpec{Subnets: subnets, BlockSizeBits: bits},
	}
}

func v4(s string) skeinv1.SubnetSet      { return skeinv1.SubnetSet{IPv4: ptr.To(s)} }
func v6(s string) skeinv1.SubnetSet      { return skeinv1.SubnetSet{IPv6: ptr.To(s)} }
func dual(a, b string) skeinv1.SubnetSet { return skeinv1.SubnetSet{IPv4: ptr.To(a), IPv6: ptr.To(b)} }

// TestAPIServer runs the real control plane with skein's CRDs and checks
// what the CRDs promise: objects round-trip, defaults apply, the OpenAPI
// and CEL validation refuses bad pools with a readable message, status is
// a subresource, and the harness's token users authenticate.
func TestAPIServer(t *testing.T) {
	env := Start(t, Options{Users: []User{{Name: "nobody"}}})
	ctx := context.Background()
	c, err := NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("create and read back", func(t *testing.T) {
		p := pool("default", 0, dual("10.64.0.0/16", "fd00:64::/112"), v4("10.65.0.0/24"))
		p.Spec.Subnets[1].IPv6 = ptr.To("fd00:65::/120")
		p.Spec.Reserved = []string{"10.64.0.1"}
		if err := c.Create(ctx, p); err != nil {
			t.Fatalf("create pool: %v", err)
		}
		got := &skeinv1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "default"}, got); err != nil {
			t.Fatalf("get pool: %v", err)
		}
		if got.Spec.BlockSizeBits != 5 {
			t.Errorf("blockSizeBits = %d, want the default 5", got.Spec.BlockSizeBits)
		}
		if len(got.Spec.Subnets) != 2 || *got.Spec.Subnets[0].IPv6 != "fd00:64::/112" || *got.Spec.Subnets[1].IPv4 != "10.65.0.0/24" ||
			len(got.Spec.Reserved) != 1 {
			t.Errorf("pool read back as %+v", got.Spec)
		}
	})

	t.Run("validation", func(t *testing.T) {
		for _, c2 := range []struct {
			name string
			pool *skeinv1.AddressPool
			want string
		}{
			{"bits too big", pool("b1", 17, v4("10.1.0.0/16")), "spec.blockSizeBits"},
			{"bits negative", pool("b2", -1, v4("10.1.0.0/16")), "spec.blockSizeBits"},
			{"no subnets", pool("b3", 5), "spec.subnets"},
			{"empty subnet", pool("b4", 5, skeinv1.SubnetSet{}), "a subnet needs ipv4, ipv6 or both"},
			{"not a CIDR", pool("b5", 5, v4("10.1.0.0")), "ipv4 must be an IPv4 CIDR"},
			{"wrong family", pool("b6", 5, v4("fd00::/64")), "ipv4 must be an IPv4 CIDR"},
			{"v4 in ipv6", pool("b7", 5, v6("10.1.0.0/16")), "ipv6 must be an IPv6 CIDR"},
			{"host bits", pool("b8", 5, v4("10.1.0.1/16")), "ipv4 has host bits set"},
			{"prefix too long", pool("b9", 5, v4("10.1.0.0/33")), "ipv4 must be an IPv4 CIDR"},
		} {
			err := c.Create(ctx, c2.pool)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c2.want) {
				t.Errorf("%s: create = %v, want Invalid mentioning %q", c2.name, err, c2.want)
			}
			if err == nil {
				_ = c.Delete(ctx, c2.pool)
			}
		}
	})

	t.Run("blockSizeBits immutable", func(t *testing.T) {
		p := pool("fixed", 5, v4("10.2.0.0/16"))
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Spec.BlockSizeBits = 6
		err := c.Update(ctx, p)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "blockSizeBits is immutable") {
			t.Errorf("update blockSizeBits = %v, want Invalid: blockSizeBits is immutable", err)
		}
	})

	t.Run("status subresource", func(t *testing.T) {
		p := pool("counted", 5, v4("10.3.0.0/24"))
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		// Status sent with the main resource is dropped...
		p.Status.BlocksTotal = 99
		p.Spec.Reserved = []string{"10.3.0.7"}
		if err := c.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		if p.Status.BlocksTotal != 0 {
			t.Errorf("update of the pool set status.blocksTotal = %d; status must only change through /status", p.Status.BlocksTotal)
		}
		// ...and written through /status, which leaves spec alone.
		p.Status = skeinv1.AddressPoolStatus{BlocksAllocated: 1, BlocksTotal: 8,
			Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Carved", Message: "ok", LastTransitionTime: metav1.Now()}}}
		p.Spec.Reserved = nil
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatalf("update status: %v", err)
		}
		got := &skeinv1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "counted"}, got); err != nil {
			t.Fatal(err)
		}
		if got.Status.BlocksTotal != 8 || got.Status.BlocksAllocated != 1 || len(got.Status.Conditions) != 1 {
			t.Errorf("status read back as %+v", got.Status)
		}
		if len(got.Spec.Reserved) != 1 {
			t.Errorf("a status update changed spec.reserved to %v", got.Spec.Reserved)
		}
	})

	t.Run("block request", func(t *testing.T) {
		r := &skeinv1.BlockRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "node1-"},
			Spec:       skeinv1.BlockRequestSpec{NodeName: "node1", PoolName: "default"},
		}
		if err := c.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		r.Spec.PoolName = "other"
		if err := c.Update(ctx, r); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "cannot be changed") {
			t.Errorf("changing a request's pool = %v, want Invalid", err)
		}
		r.Spec.PoolName = "default"
		r.Status.AddressBlockName = skeinv1.BlockName("default", 0)
		r.Status.Conditions = []metav1.Condition{{Type: skeinv1.ConditionComplete, Status: metav1.ConditionTrue,
			Reason: skeinv1.ReasonBlockCarved, LastTransitionTime: metav1.Now()}}
		if err := c.Status().Update(ctx, r); err != nil {
			t.Fatalf("update request status: %v", err)
		}
		bad := &skeinv1.BlockRequest{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: skeinv1.BlockRequestSpec{NodeName: "node1"}}
		if err := c.Create(ctx, bad); !apierrors.IsInvalid(err) {
			t.Errorf("request without a pool = %v, want Invalid", err)
		}
	})

	t.Run("block index, node and name", func(t *testing.T) {
		b := &skeinv1.AddressBlock{
			ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("default", 3),
				Labels: map[string]string{skeinv1.LabelPool: "default", skeinv1.LabelNode: "node1"}},
			NodeName: "node1", Index: 3, IPv4: ptr.To("10.64.0.96/27"),
		}
		if err := c.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		b.Index = 4
		if err := c.Update(ctx, b); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "index is immutable") {
			t.Errorf("changing a block's index = %v, want Invalid", err)
		}
		b.Index = 3
		b.NodeName = "node2"
		if err := c.Update(ctx, b); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "nodeName is immutable once set") {
			t.Errorf("changing a block's nodeName = %v, want Invalid", err)
		}
		for _, name := range []string{"default-4", "default3", "3"} {
			bad := &skeinv1.AddressBlock{ObjectMeta: metav1.ObjectMeta{Name: name}, NodeName: "node1", Index: 3}
			if err := c.Create(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "the name must be <pool>-<index>") {
				t.Errorf("block %s with index 3 = %v, want Invalid", name, err)
			}
		}
	})

	t.Run("printer columns", func(t *testing.T) {
		out, err := env.Kubectl("get", "addresspools", "counted")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "BLOCK BITS") || !strings.Contains(string(out), "counted   5            1        8") {
			t.Errorf("kubectl get addresspools:\n%s", out)
		}
		out, err = env.Kubectl("get", "skblock")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "default-3   default   node1   3       10.64.0.96/27") {
			t.Errorf("kubectl get skblock:\n%s", out)
		}
	})

	// The harness's token users authenticate as themselves (what
	// RBAC then allows them is Kubernetes's business, not tested here).
	t.Run("token users", func(t *testing.T) {
		cs, err := kubernetes.NewForConfig(env.UserConfig("nobody"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review as nobody: %v", err)
		}
		if u := r.Status.UserInfo.Username; u != "nobody" {
			t.Errorf("UserConfig(\"nobody\") authenticates as %q", u)
		}
	})
}

// TestStop checks Stop ends both processes and removes the directory.
func TestStop(t *testing.T) {
	env := Start(t, Options{})
	procs := []*proc{env.etcd, env.apiserver}
	env.Stop()
	for _, p := range procs {
		if !p.exited() {
			t.Errorf("%s still runs after Stop", p.name)
		}
		if err := syscall.Kill(p.cmd.Process.Pid, 0); err == nil {
			t.Errorf("%s (pid %d) still exists after Stop", p.name, p.cmd.Process.Pid)
		}
	}
	if _, err := os.Stat(env.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Stop (%v)", env.Dir, err)
	}
	env.Stop() // twice is fine
}

// TestGarbageCollector checks StartGarbageCollector's collector deletes a
// dependent once its owner is gone, and Stop ends it with the rest.
func TestGarbageCollector(t *testing.T) {
	env := Start(t, Options{})
	env.StartGarbageCollector(t)
	ctx := context.Background()
	c, err := NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "default"}}
	if err := c.Create(ctx, owner); err != nil {
		t.Fatalf("create owner: %v", err)
	}
	dep := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dependent", Namespace: "default",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}}}}
	if err := c.Create(ctx, dep); err != nil {
		t.Fatalf("create dependent: %v", err)
	}
	if err := c.Delete(ctx, owner); err != nil {
		t.Fatalf("delete owner: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Get(ctx, client.ObjectKeyFromObject(dep), &corev1.ConfigMap{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dependent still there 30s after its owner was deleted (get: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p := env.controllerManager
	env.Stop()
	if !p.exited() {
		t.Errorf("%s still runs after Stop", p.name)
	}
}

// TestTokens: the API server mints service account tokens and
// authenticates them; a token bound to a Pod on a Node carries that node
// (the extra NodeNameExtra, what per-node policies read), one bound to
// nothing does not.
func TestTokens(t *testing.T) {
	env := Start(t, Options{})
	ctx := context.Background()
	whoami := func(t *testing.T, token string) authenticationv1.UserInfo {
		t.Helper()
		cs, err := kubernetes.NewForConfig(env.TokenConfig(token))
		if err != nil {
			t.Fatal(err)
		}
		r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review: %v", err)
		}
		return r.Status.UserInfo
	}
	const user = "system:serviceaccount:ns1:agent"

	bound := env.NodeToken(t, "ns1", "agent", "n1")
	u := whoami(t, bound)
	if u.Username != user || !slices.Equal(u.Extra[NodeNameExtra], []string{"n1"}) ||
		!slices.Equal(u.Extra["authentication.kubernetes.io/pod-name"], []string{"token-agent-n1"}) {
		t.Errorf("a token bound to a pod on n1 authenticates as %+v; want %s with %s [n1]", u, user, NodeNameExtra)
	}
	// A second call reuses the Pod; another node gets its own.
	if u := whoami(t, env.NodeToken(t, "ns1", "agent", "n1")); !slices.Equal(u.Extra[NodeNameExtra], []string{"n1"}) {
		t.Errorf("a second token for n1 authenticates as %+v", u)
	}
	if u := whoami(t, env.NodeToken(t, "ns1", "agent", "n2")); !slices.Equal(u.Extra[NodeNameExtra], []string{"n2"}) {
		t.Errorf("a token for n2 authenticates as %+v", u)
	}

	u = whoami(t, env.ServiceAccountToken(t, "ns1", "agent"))
	if _, ok := u.Extra[NodeNameExtra]; u.Username != user || ok {
		t.Errorf("an unbound token authenticates as %+v; want %s, no node", u, user)
	}

	// The token lives as long as its Pod.
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods("ns1").Delete(ctx, "token-agent-n1", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := kubernetes.NewForConfig(env.TokenConfig(bound))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if apierrors.IsUnauthorized(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the token of a deleted pod still authenticates (last: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

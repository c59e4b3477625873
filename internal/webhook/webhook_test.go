package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

func init() { ctrl.SetLogger(logr.Discard()) }

// The tests run as the controller's service account with only the RBAC of
// deploy/kubernetes/webhook, in the namespace of the manifests.
const (
	testNamespace = DefaultNamespace
	manifests     = "../../deploy/kubernetes/webhook"
	controllerSA  = "system:serviceaccount:skein-system:skein-controller"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// setup starts the API server, the namespace and a webhook configuration
// that calls https://127.0.0.1:port with no caBundle yet.
func setup(t *testing.T, port int) (*kube.Env, client.Client) {
	t.Helper()
	env := kube.Start(t, kube.Options{Users: []kube.User{{Name: controllerSA}}})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl("apply", "-f", filepath.Join(manifests, "rbac.yaml")); err != nil {
		t.Fatalf("apply RBAC: %v: %s", err, out)
	}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + Path
	egressURL := "https://127.0.0.1:" + strconv.Itoa(port) + PathEgress
	blockURL := "https://127.0.0.1:" + strconv.Itoa(port) + PathBlock
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultConfigName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "addresspools.skein.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](5),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"skein.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"addresspools"},
					Scope: ptr.To(admissionregistrationv1.ClusterScope),
				},
			}},
		}, {
			Name:                    "egresses.skein.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &egressURL},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](5),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"skein.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"egresses"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope),
				},
			}},
		}, {
			Name:                    "addressblocks.skein.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &blockURL},
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds:          ptr.To[int32](5),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"skein.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"addressblocks"},
					Scope: ptr.To(admissionregistrationv1.ClusterScope),
				},
			}},
		}},
	}
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	return env, c
}

// startWebhook runs a manager with Add's pieces until the test ends.
func startWebhook(t *testing.T, env *kube.Env, opts Options) *rotator {
	t.Helper()
	mgr, err := ctrl.NewManager(env.UserConfig(controllerSA), ctrl.Options{
		Scheme:                 kube.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := add(mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return r
}

// probe is a valid pool, created with dryRun: it passes only through a
// working webhook (failurePolicy Fail) and leaves nothing behind.
func probe(ctx context.Context, c client.Client) error {
	return c.Create(ctx, pool("probe", 5, v4("192.168.250.0/24")), client.DryRunAll)
}

// waitServing waits until the API server reaches the webhook.
func waitServing(t *testing.T, c client.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := probe(context.Background(), c)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhook not reachable through the API server: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// served is the serial of the certificate the server on port presents.
func served(t *testing.T, port int) string {
	t.Helper()
	conn, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("dial webhook: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func secretSet(t *testing.T, c client.Client) *certSet {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: testNamespace, Name: DefaultSecretName}, sec); err != nil {
		t.Fatal(err)
	}
	s, err := parseCertSet(sec.Data, true)
	if err != nil {
		t.Fatalf("secret: %v", err)
	}
	return s
}

func caBundle(t *testing.T, c client.Client) []byte {
	t.Helper()
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: DefaultConfigName}, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Webhooks[0].ClientConfig.CABundle
}

// refused asserts err is the webhook's (or the schema's) refusal saying want.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted", what)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %q does not say %q", what, err, want)
	}
}

func TestWebhookThroughAPIServer(t *testing.T) {
	port := freePort(t)
	env, c := setup(t, port)
	r := startWebhook(t, env, Options{Port: port})
	waitServing(t, c)
	ctx := context.Background()

	// The caBundle the controller patched is the Secret's.
	set := secretSet(t, c)
	if !bytes.Equal(caBundle(t, c), set.data[keyCABundle]) {
		t.Fatal("caBundle is not the Secret's bundle")
	}
	if got := served(t, port); got != set.leaf.SerialNumber.String() {
		t.Fatalf("server presents certificate %s, the Secret holds %s", got, set.leaf.SerialNumber)
	}

	a := pool("a", 5, dual("10.64.0.0/24", "fd00:64::/120"))
	if err := c.Create(ctx, a); err != nil {
		t.Fatalf("valid pool refused: %v", err)
	}
	const denied = `admission webhook "addresspools.skein.dev" denied the request`
	refused(t, "overlapping pool", c.Create(ctx, pool("b", 5, v4("10.64.0.128/25"))), denied)
	refused(t, "overlapping pool", c.Create(ctx, pool("b", 5, v4("10.64.0.128/25"))), `10.64.0.128/25 overlaps 10.64.0.0/24 of AddressPool "a"`)
	refused(t, "unpaired sizes", c.Create(ctx, pool("b", 5, dual("10.65.0.0/24", "fd00:65::/64"))), "same size")

	// Updates: re-read each time, so a refusal is the rule's, not a conflict.
	update := func(edit func(*skeinv1.AddressPool)) error {
		p := &skeinv1.AddressPool{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(a), p); err != nil {
			t.Fatal(err)
		}
		edit(p)
		return c.Update(ctx, p)
	}
	refused(t, "blockSizeBits changed", update(func(p *skeinv1.AddressPool) { p.Spec.BlockSizeBits = 6 }), "blockSizeBits is immutable")
	refused(t, "subnet removed", update(func(p *skeinv1.AddressPool) {
		p.Spec.Subnets = append(p.Spec.Subnets, dual("10.66.0.0/24", "fd00:66::/120"))[1:]
	}), "subnets may only be appended")
	refused(t, "subnet changed", update(func(p *skeinv1.AddressPool) { p.Spec.Subnets[0].IPv4 = ptr.To("10.64.0.0/23") }), denied)
	if err := update(func(p *skeinv1.AddressPool) {
		p.Spec.Subnets = append(p.Spec.Subnets, dual("10.66.0.0/24", "fd00:66::/120"))
	}); err != nil {
		t.Fatalf("append refused: %v", err)
	}
	refused(t, "overlapping the appended subnet", c.Create(ctx, pool("b", 5, v4("10.66.0.0/16"))), `of AddressPool "a"`)
	got := &skeinv1.AddressPool{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(a), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Subnets) != 2 || got.Spec.BlockSizeBits != 5 {
		t.Fatalf("pool after refusals and one append: %+v", got.Spec)
	}
	var list skeinv1.AddressPoolList
	if err := c.List(ctx, &list); err != nil || len(list.Items) != 1 {
		t.Fatalf("pools: %d (err %v), want only a", len(list.Items), err)
	}

	// Rotation: a new certificate is served at once, the new caBundle is
	// patched, and requests never fail on the way.
	before := caBundle(t, c)
	if err := r.Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := probe(ctx, c); err != nil {
		t.Fatalf("request right after rotation: %v", err)
	}
	after := secretSet(t, c)
	if after.leaf.SerialNumber.Cmp(set.leaf.SerialNumber) == 0 || !after.ca.Equal(set.next) {
		t.Fatal("rotation did not sign a new certificate with the next CA")
	}
	if got := caBundle(t, c); bytes.Equal(got, before) || !bytes.Equal(got, after.data[keyCABundle]) {
		t.Fatal("caBundle not patched with the rotated bundle")
	}
	if got := served(t, port); got != after.leaf.SerialNumber.String() {
		t.Fatalf("server presents %s after rotation, want %s", got, after.leaf.SerialNumber)
	}
	for i := 0; i < 20; i++ {
		if err := probe(ctx, c); err != nil {
			t.Fatalf("request %d after rotation: %v", i, err)
		}
	}
	if err := c.Create(ctx, pool("b", 5, v4("10.67.0.0/24"))); err != nil {
		t.Fatalf("valid pool after rotation: %v", err)
	}

	// A damaged serving certificate is reissued from the current CA on the
	// next check: the CAs, which the API server and other replicas trust,
	// stay.
	intact := secretSet(t, c)
	bundleBefore := caBundle(t, c)
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: DefaultSecretName}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data[keyCert] = []byte("not a certificate")
	if err := c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	if err := r.sync(ctx, false); err != nil {
		t.Fatalf("check after damage: %v", err)
	}
	fresh := secretSet(t, c)
	if !bytes.Equal(caBundle(t, c), fresh.data[keyCABundle]) || served(t, port) != fresh.leaf.SerialNumber.String() {
		t.Fatal("damaged Secret not replaced, patched and served")
	}
	if !fresh.ca.Equal(intact.ca) || !fresh.next.Equal(intact.next) || !bytes.Equal(caBundle(t, c), bundleBefore) {
		t.Fatal("the CAs were replaced though only the serving certificate was damaged")
	}
	if err := r.ready(nil); err != nil {
		t.Fatalf("ready with a certificate loaded: %v", err)
	}
	if err := (&rotator{}).ready(nil); err == nil {
		t.Fatal("a replica with no certificate loaded reports ready")
	}
	waitServing(t, c)
}

// Two replicas with short-lived certificates share one Secret: they rotate
// on their own when due, never twice for one generation, both serve what
// the Secret holds, and the API server's requests keep passing throughout.
func TestWebhookReplicasRotate(t *testing.T) {
	const validity = 6 * time.Second
	port, port2 := freePort(t), freePort(t)
	env, c := setup(t, port)
	opts := Options{Port: port, Validity: validity, CheckInterval: 200 * time.Millisecond}
	startWebhook(t, env, opts)
	opts.Port = port2
	startWebhook(t, env, opts)
	waitServing(t, c)

	ctx := context.Background()
	issued := map[string]time.Time{} // serial → NotBefore
	start := time.Now()
	for time.Since(start) < 2*validity {
		if err := probe(ctx, c); err != nil {
			t.Fatalf("request at %v: %v", time.Since(start).Round(time.Millisecond), err)
		}
		leaf := secretSet(t, c).leaf
		issued[leaf.SerialNumber.String()] = leaf.NotBefore
		time.Sleep(100 * time.Millisecond)
	}
	// One rotation when a third of the validity is left: every 4 s for
	// 6 s, or down to 3 s, since certificates carry whole seconds and
	// NotAfter may fall up to a second short. So 2 to 4 rotations in
	// 2*validity, plus the certificate there at the start.
	if n := len(issued); n < 3 || n > 5 {
		t.Errorf("%d certificates in %v with validity %v, want 3 to 5", n, 2*validity, validity)
	}
	// Replicas fighting over one generation would issue two certificates
	// within a check interval (200 ms) of each other: consecutive ones
	// must be at least 2 s apart.
	var times []time.Time
	for _, nb := range issued {
		times = append(times, nb)
	}
	slices.SortFunc(times, time.Time.Compare)
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap < 2*time.Second {
			t.Errorf("two certificates issued %v apart (%v, %v): two rotations of one generation", gap, times[i-1], times[i])
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		want := secretSet(t, c).leaf.SerialNumber.String()
		a, b := served(t, port), served(t, port2)
		if a == want && b == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas serve %s and %s, the Secret holds %s", a, b, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The cluster manifest names what Options' zero value and Path do.
func TestManifestMatchesDefaults(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(manifests, "validatingwebhookconfiguration.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Name != DefaultConfigName || len(cfg.Webhooks) != 3 {
		t.Fatalf("configuration %q with %d webhooks, want %q with 3 (pools, egresses, blocks)", cfg.Name, len(cfg.Webhooks), DefaultConfigName)
	}
	bw := cfg.Webhooks[2]
	if svc := bw.ClientConfig.Service; svc == nil || svc.Name != DefaultServiceName || svc.Namespace != DefaultNamespace ||
		svc.Path == nil || *svc.Path != PathBlock {
		t.Errorf("block webhook clientConfig.service %+v, want %s/%s path %s", svc, DefaultNamespace, DefaultServiceName, PathBlock)
	}
	if r := bw.Rules; len(r) != 1 || len(r[0].Resources) != 1 || r[0].Resources[0] != "addressblocks" || len(r[0].Operations) != 1 ||
		r[0].Operations[0] != admissionregistrationv1.Create {
		t.Errorf("block webhook rules %+v, want CREATE of addressblocks", r)
	}
	eg := cfg.Webhooks[1]
	if svc := eg.ClientConfig.Service; svc == nil || svc.Name != DefaultServiceName || svc.Namespace != DefaultNamespace ||
		svc.Path == nil || *svc.Path != PathEgress {
		t.Errorf("egress webhook clientConfig.service %+v, want %s/%s path %s", svc, DefaultNamespace, DefaultServiceName, PathEgress)
	}
	if p := eg.FailurePolicy; p == nil || *p != admissionregistrationv1.Fail {
		t.Error("egress webhook failurePolicy is not Fail")
	}
	if r := eg.Rules; len(r) != 1 || len(r[0].Resources) != 1 || r[0].Resources[0] != "egresses" || len(r[0].Operations) != 2 ||
		r[0].Scope == nil || *r[0].Scope != admissionregistrationv1.NamespacedScope {
		t.Errorf("egress webhook rules %+v, want CREATE and UPDATE of namespaced egresses", r)
	}
	svc := cfg.Webhooks[0].ClientConfig.Service
	if svc == nil || svc.Name != DefaultServiceName || svc.Namespace != DefaultNamespace || svc.Path == nil || *svc.Path != Path {
		t.Errorf("clientConfig.service %+v, want %s/%s path %s", svc, DefaultNamespace, DefaultServiceName, Path)
	}
	if p := cfg.Webhooks[0].FailurePolicy; p == nil || *p != admissionregistrationv1.Fail {
		t.Error("failurePolicy is not Fail")
	}
	r := cfg.Webhooks[0].Rules
	if len(r) != 1 || len(r[0].Resources) != 1 || r[0].Resources[0] != "addresspools" || len(r[0].Operations) != 2 {
		t.Errorf("rules %+v, want CREATE and UPDATE of addresspools", r)
	}
}

// A node's claim is checked against its pool through the API server: the
// block's addresses must be its index's slices, its index in the pool,
// and a node holds at most the pool's maxBlocksPerNode.
func TestBlockClaimsChecked(t *testing.T) {
	port := freePort(t)
	env, c := setup(t, port)
	startWebhook(t, env, Options{Port: port})
	waitServing(t, c)
	ctx := context.Background()
	p := pool("small", 3, dual("10.64.0.0/28", "fd00:64::/124")) // 2 blocks of 8
	p.Spec.MaxBlocksPerNode = 1
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	block := func(index int64, node, v4, v6 string) *skeinv1.AddressBlock {
		return &skeinv1.AddressBlock{
			ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("small", uint32(index)),
				Labels: map[string]string{skeinv1.LabelPool: "small", skeinv1.LabelNode: node}},
			NodeName: node, Index: index, IPv4: ptr.To(v4), IPv6: ptr.To(v6),
		}
	}
	const denied = `admission webhook "addressblocks.skein.dev" denied the request`
	refused(t, "another index's addresses", c.Create(ctx, block(0, "n1", "10.64.0.8/29", "fd00:64::8/125")), `block 0 of AddressPool small is "10.64.0.0/29"`)
	refused(t, "an index past the pool", c.Create(ctx, block(2, "n1", "10.64.0.16/29", "fd00:64::10/125")), denied)
	if err := c.Create(ctx, block(0, "n1", "10.64.0.0/29", "fd00:64::/125")); err != nil {
		t.Fatalf("a right block refused: %v", err)
	}
	// The cache behind the count sees the first block within moments.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Create(ctx, block(1, "n1", "10.64.0.8/29", "fd00:64::8/125"), client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "maxBlocksPerNode") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a second block of n1 (maxBlocksPerNode 1): %v, want refused", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.Create(ctx, block(1, "n2", "10.64.0.8/29", "fd00:64::8/125")); err != nil {
		t.Fatalf("n2's first block refused: %v", err)
	}
	// The pool deleted by force while its blocks stay: a new pool over
	// their addresses is refused while they are there.
	if err := c.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for c.Get(ctx, client.ObjectKeyFromObject(p), &skeinv1.AddressPool{}) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	refused(t, "a pool over a block left by a deleted pool", c.Create(ctx, pool("over", 3, v4("10.64.0.0/24"))), "outlived pool")
}

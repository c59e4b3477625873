package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// skeind's identity as deploy/kubernetes ships it.
const (
	Namespace = "skein-system"
	Account   = "skeind"
)

// InstallIdentity creates what deploy/kubernetes ships for skeind's
// identity — namespace.yaml, skeind-rbac.yaml and skeind-policy.yaml
// (the policies and their bindings) — as the admin. NodeKubeconfig then
// gives each skeind its own node's credentials.
func InstallIdentity(t testing.TB, admin client.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, file := range []string{"namespace.yaml", "skeind-rbac.yaml", "skeind-policy.yaml"} {
		for _, o := range Manifests(t, file) {
			if err := admin.Create(ctx, o); err != nil {
				t.Fatalf("create %s %s from %s: %v", o.GetKind(), o.GetName(), file, err)
			}
		}
	}
}

// Manifests decodes every object of deploy/kubernetes/<file> (a path
// below it): the shipped files are what the tests run against.
func Manifests(t testing.TB, file string) []*unstructured.Unstructured {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "deploy", "kubernetes", file)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	d := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var m map[string]any
		err := d.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decode %s: %v", path, err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
	if len(out) == 0 {
		t.Fatalf("no objects in %s", path)
	}
	return out
}

// NodeKubeconfig writes a kubeconfig that reaches env with a token of
// skein-system/skeind bound to a Pod on node (kube.Env.NodeToken): what
// the kubelet mounts into skeind's pod on that node. It returns once the
// API server enforces the per-node policy on that token (a block for
// another node is refused), so that a skeind started with it runs under
// the policy from its first request.
func NodeKubeconfig(t testing.TB, env *kube.Env, node string) string {
	t.Helper()
	tok := env.NodeToken(t, Namespace, Account, node)
	c, err := kube.NewClient(env.TokenConfig(tok))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for try := 0; ; try++ {
		err := refused(ctx, admin, c, node, try)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the policy skeind-own-blocks is not enforced on node %s's token: %v", node, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["skein-test"] = &clientcmdapi.Cluster{Server: env.URL, CertificateAuthority: env.CAFile}
	cfg.AuthInfos[node] = &clientcmdapi.AuthInfo{Token: tok}
	cfg.Contexts["skein-test"] = &clientcmdapi.Context{Cluster: "skein-test", AuthInfo: node}
	cfg.CurrentContext = "skein-test"
	path := filepath.Join(t.TempDir(), "kubeconfig-"+node)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("write kubeconfig of node %s: %v", node, err)
	}
	return path
}

// refused tries, as node, to create a block that names another node: nil
// when a ValidatingAdmissionPolicy refuses it. A block that gets made
// (the binding not seen yet) is deleted again by the admin.
func refused(ctx context.Context, admin, c client.Client, node string, try int) error {
	other := "not-" + node
	b := &skeinv1.AddressBlock{
		ObjectMeta: metav1.ObjectMeta{Name: skeinv1.BlockName("identity-probe", uint32(try)),
			Labels: map[string]string{skeinv1.LabelPool: "identity-probe", skeinv1.LabelNode: other}},
		NodeName: other, Index: int64(try),
	}
	err := c.Create(ctx, b)
	switch {
	case err == nil:
		if derr := admin.Delete(ctx, b); derr != nil {
			return fmt.Errorf("a block for %s was made, and not deleted: %w", other, derr)
		}
		return fmt.Errorf("a block for node %s was made with node %s's token", other, node)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
		return nil
	}
	return fmt.Errorf("not refused by a policy: %w", err)
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/skeinnet/skein\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the skein module (no go.mod above the working directory)")
		}
		dir = parent
	}
}

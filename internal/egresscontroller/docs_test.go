package egresscontroller

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/tools"
)

// TestDocsCommands runs docs/egress.md's example as a reader would: its
// YAML saved as egress.yaml and the kubectl commands of its sh block, as
// written, against a real API server with the Egress reconciler running,
// then checks what the guide says follows (a Deployment and Service named
// like the Egress, scaled by `kubectl scale`, and the namespace's router
// account). A guide whose example does not work fails here.
func TestDocsCommands(t *testing.T) {
	guide := filepath.Join("..", "..", "docs", "egress.md")
	yamlBlock, err := tools.FencedBlock(guide, "yaml")
	if err != nil {
		t.Fatal(err)
	}
	shBlock, err := tools.FencedBlock(guide, "sh")
	if err != nil {
		t.Fatal(err)
	}
	env, c := startEgress(t, Options{})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "egress.yaml"), []byte(yamlBlock), 0o644); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(shBlock, "\n") {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		for _, cmd := range strings.Split(line, ";") {
			args := strings.Fields(cmd)
			if len(args) == 0 {
				continue
			}
			if args[0] != "kubectl" || strings.ContainsAny(cmd, `"'$`) {
				t.Fatalf("docs/egress.md runs %q: teach this test", cmd)
			}
			for i, a := range args {
				if a == "egress.yaml" {
					args[i] = filepath.Join(dir, a)
				}
			}
			n++
			// Right after the apply, the reconciler may not have made the
			// Deployment yet: each command is retried until it works.
			var out []byte
			kube.Eventually(t, 30*time.Second, "docs/egress.md: "+strings.TrimSpace(cmd), func() string {
				if out, err = env.Kubectl(args[1:]...); err != nil {
					return err.Error()
				}
				return ""
			})
			t.Logf("%s\n%s", strings.TrimSpace(cmd), out)
		}
	}
	if n < 4 {
		t.Fatalf("docs/egress.md's sh block has %d commands; the test reads too little", n)
	}
	ctx := context.Background()
	kube.Eventually(t, 30*time.Second, "the Deployment scaled by kubectl scale", func() string {
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKey{Namespace: "internet", Name: "nat"}, &d); err != nil {
			return err.Error()
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
			return "replicas not 3"
		}
		return ""
	})
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: "internet", Name: "nat"}, &svc); err != nil {
		t.Fatalf("the guide's Service: %v", err)
	}
}

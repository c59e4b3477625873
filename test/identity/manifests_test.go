package identity

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// split separates the policy bindings from the rest of objs.
func split(objs []*unstructured.Unstructured) (bindings, rest []*unstructured.Unstructured) {
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicyBinding" {
			bindings = append(bindings, o)
		} else {
			rest = append(rest, o)
		}
	}
	return bindings, rest
}

func create(ctx context.Context, t *testing.T, c client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(ctx, o.DeepCopy()); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// checkTypes waits until the API server has type-checked each policy
// against the kinds it matches and fails on any warning (a field that
// does not exist, a type mismatch): such an expression would only fail
// when evaluated, refusing what it should allow.
func checkTypes(ctx context.Context, t *testing.T, c client.Client, names []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for _, name := range names {
		for {
			var p admissionregistrationv1.ValidatingAdmissionPolicy
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
				t.Fatalf("get ValidatingAdmissionPolicy %s: %v", name, err)
			}
			if p.Status.ObservedGeneration == p.Generation && p.Status.TypeChecking != nil {
				for _, w := range p.Status.TypeChecking.ExpressionWarnings {
					t.Errorf("policy %s: %s: %s", name, w.FieldRef, w.Warning)
				}
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("policy %s not type-checked: status %+v", name, p.Status)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// policyNames are the names of objs' ValidatingAdmissionPolicies.
func policyNames(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			out = append(out, o.GetName())
		}
	}
	slices.Sort(out)
	return out
}

// waitUntil polls probe until it returns nil, at most 30 s.
func waitUntil(ctx context.Context, what string, probe func(try int) error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for try := 0; ; try++ {
		err := probe(try)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

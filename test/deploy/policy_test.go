package deploy

import (
	"context"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// checkIdentityPolicy checks the per-node identity policies of the base
// as objects (test/identity checks what they refuse): each is bound,
// denies, fails closed, applies to the account skeind's DaemonSet runs as
// (by the name the API server gives it, in the namespace the base puts
// it), and together they cover the writes that account's RBAC allows and
// cannot narrow to a node: AddressBlocks, Nodes, Leases.
func checkIdentityPolicy(ctx context.Context, t *testing.T, c client.Client) {
	var ds appsv1.DaemonSet
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "skeind"}, &ds); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + ds.Namespace + ":" + ds.Spec.Template.Spec.ServiceAccountName
	var policies admissionregistrationv1.ValidatingAdmissionPolicyList
	if err := c.List(ctx, &policies, client.MatchingLabels{"app.kubernetes.io/part-of": "skein"}); err != nil {
		t.Fatal(err)
	}
	var bindings admissionregistrationv1.ValidatingAdmissionPolicyBindingList
	if err := c.List(ctx, &bindings, client.MatchingLabels{"app.kubernetes.io/part-of": "skein"}); err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{} // group/resource
	for _, p := range policies.Items {
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
			t.Errorf("policy %s: failurePolicy %v, want Fail", p.Name, p.Spec.FailurePolicy)
		}
		want := "request.userInfo.username == '" + user + "'"
		if !slices.ContainsFunc(p.Spec.MatchConditions, func(m admissionregistrationv1.MatchCondition) bool { return m.Expression == want }) {
			t.Errorf("policy %s does not match skeind's account: matchConditions %+v, want %q", p.Name, p.Spec.MatchConditions, want)
		}
		if !slices.ContainsFunc(p.Spec.Validations, func(v admissionregistrationv1.Validation) bool {
			return strings.Contains(v.Expression, "variables.node != ''")
		}) {
			t.Errorf("policy %s does not refuse a token naming no node", p.Name)
		}
		bound := slices.ContainsFunc(bindings.Items, func(b admissionregistrationv1.ValidatingAdmissionPolicyBinding) bool {
			return b.Spec.PolicyName == p.Name && slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) &&
				b.Spec.MatchResources == nil && b.Spec.ParamRef == nil
		})
		if !bound {
			t.Errorf("policy %s has no binding that denies everything it matches", p.Name)
		}
		if p.Spec.MatchConstraints == nil {
			continue
		}
		for _, r := range p.Spec.MatchConstraints.ResourceRules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					covered[g+"/"+res] = true
				}
			}
		}
	}
	for _, gr := range []string{"skein.dev/addressblocks", "/nodes", "coordination.k8s.io/leases"} {
		if !covered[gr] {
			t.Errorf("no skein policy covers %s: covered %v", gr, covered)
		}
	}
	for _, b := range bindings.Items {
		if !slices.ContainsFunc(policies.Items, func(p admissionregistrationv1.ValidatingAdmissionPolicy) bool { return p.Name == b.Spec.PolicyName }) {
			t.Errorf("binding %s names policy %q, not in the base", b.Name, b.Spec.PolicyName)
		}
	}
}

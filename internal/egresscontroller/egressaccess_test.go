package egresscontroller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

// envFieldPath is the downward API field of ctr's variable name, or "".
func envFieldPath(ctr *corev1.Container, name string) string {
	for _, e := range ctr.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}

// The router pod runs as the namespace's skein-egress account, knows its
// addresses from the downward API, is probed on /readyz and may set its
// sysctls; spec.template's choices win over each of these.
func TestEgressRouterPod(t *testing.T) {
	_, c := startEgress(t, Options{})
	ctx := context.Background()
	eg := newEgress("pod", "0.0.0.0/0")
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	eventually(t, "deployment", func() string {
		var msg string
		dep, msg = getDeployment(t, c, "pod")
		return msg
	})
	pod := dep.Spec.Template.Spec
	if pod.ServiceAccountName != EgressServiceAccount {
		t.Errorf("service account %q, want %q", pod.ServiceAccountName, EgressServiceAccount)
	}
	ctr := routerContainer(dep)
	for name, path := range map[string]string{"POD_IP": "status.podIP", "POD_IPS": "status.podIPs",
		"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
		if got := envFieldPath(ctr, name); got != path {
			t.Errorf("$%s from %q, want the downward API's %s", name, got, path)
		}
	}
	if p := ctr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.IntValue() != EgressMetricsPort {
		t.Errorf("readiness probe %+v, want GET /readyz on %d", p, EgressMetricsPort)
	}
	if sc := ctr.SecurityContext; sc == nil || !ptr.Deref(sc.Privileged, false) {
		t.Errorf("security context %+v, want privileged (the router sets net sysctls)", sc)
	}

	// Overrides win; what they leave out keeps its default. Another
	// account and a securityContext need the administrator's allowance.
	allowCustomPods(t, c, egressNS, "true")
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) {
		eg.Spec.Template = egressOverrides()
	})
	eventually(t, "overridden pod", func() string {
		d, msg := getDeployment(t, c, "pod")
		if msg != "" {
			return msg
		}
		ctr := routerContainer(d)
		switch {
		case d.Spec.Template.Spec.ServiceAccountName != "custom":
			return "service account " + d.Spec.Template.Spec.ServiceAccountName
		case ctr.ReadinessProbe == nil || ctr.ReadinessProbe.HTTPGet == nil || ctr.ReadinessProbe.HTTPGet.Path != "/other":
			return fmt.Sprintf("probe %+v", ctr.ReadinessProbe)
		case ctr.SecurityContext == nil || ptr.Deref(ctr.SecurityContext.Privileged, false):
			return fmt.Sprintf("security context %+v", ctr.SecurityContext)
		case envFieldPath(ctr, "POD_IPS") != "status.podIPs":
			return fmt.Sprintf("env %+v lacks POD_IPS", ctr.Env)
		}
		n := 0
		for _, e := range ctr.Env {
			if e.Name == "POD_IP" {
				n++
				if e.Value != "192.0.2.9" || e.ValueFrom != nil {
					return fmt.Sprintf("POD_IP %+v, want the override", e)
				}
			}
		}
		if n != 1 {
			return fmt.Sprintf("%d POD_IP variables", n)
		}
		return ""
	})
}

func egressOverrides() *skeinv1.EgressPodTemplate {
	return &skeinv1.EgressPodTemplate{Spec: corev1.PodSpec{
		ServiceAccountName: "custom",
		Containers: []corev1.Container{{
			Name:            skeinv1.EgressContainerName,
			Env:             []corev1.EnvVar{{Name: "POD_IP", Value: "192.0.2.9"}},
			ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/other", Port: intstr.FromInt32(9999)}}},
			SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}},
		}},
		SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_forward", Value: "1"}}},
	}}
}

// updateEgress applies mutate to the latest eg and writes it, again on a
// conflict (the controller writes its status meanwhile).
func updateEgress(t *testing.T, c client.Client, eg *skeinv1.Egress, mutate func(*skeinv1.Egress)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(eg), eg); err != nil {
			return err
		}
		mutate(eg)
		return c.Update(context.Background(), eg)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func getSA(c client.Client, ns string) (*corev1.ServiceAccount, error) {
	sa := &corev1.ServiceAccount{}
	err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: EgressServiceAccount}, sa)
	return sa, err
}

// bindingNamespaces are the namespaces of the binding's subjects, after
// checking its role and subjects' kind.
func bindingNamespaces(c client.Client) ([]string, string) {
	crb := &rbacv1.ClusterRoleBinding{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: EgressRBACName}, crb); err != nil {
		return nil, err.Error()
	}
	if crb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "skein-egress"}) {
		return nil, fmt.Sprintf("binding's role %+v", crb.RoleRef)
	}
	var out []string
	for _, s := range crb.Subjects {
		if s.Kind != rbacv1.ServiceAccountKind || s.Name != EgressServiceAccount {
			return nil, fmt.Sprintf("subject %+v", s)
		}
		out = append(out, s.Namespace)
	}
	return out, ""
}

// podBindingNamespaces are the namespaces whose router accounts have a
// pod RoleBinding (each in its own namespace, to the ClusterRole
// skein-egress), after checking their shape.
func podBindingNamespaces(c client.Client) ([]string, string) {
	var list rbacv1.RoleBindingList
	if err := c.List(context.Background(), &list, client.HasLabels{LabelEgressAccount}); err != nil {
		return nil, err.Error()
	}
	var out []string
	for _, rb := range list.Items {
		ns := rb.Labels[LabelEgressAccount]
		want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: EgressServiceAccount, Namespace: ns}
		if rb.Namespace != ns || rb.Name != "skein-egress-"+ns || len(rb.Subjects) != 1 || rb.Subjects[0] != want ||
			rb.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "skein-egress"}) {
			return nil, fmt.Sprintf("pod RoleBinding %s/%s: %+v %+v", rb.Namespace, rb.Name, rb.RoleRef, rb.Subjects)
		}
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, ""
}

func ownerNames(sa *corev1.ServiceAccount) []string {
	var out []string
	for _, o := range sa.OwnerReferences {
		if o.Kind == "Egress" && o.APIVersion == skeinv1.GroupVersion.String() && !ptr.Deref(o.Controller, false) {
			out = append(out, o.Name)
		}
	}
	return out
}

// One account per namespace, owned by each Egress there and removed with
// the last; the accounts of the namespaces that have Egresses, and only
// those, may read their pods (a RoleBinding there each). An
// account of the same name the controller did not make is used, never
// changed or removed.
func TestEgressServiceAccount(t *testing.T) {
	_, c := startEgress(t, Options{})
	ctx := context.Background()
	for _, ns := range []string{"second", "theirs"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	theirs := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "theirs", Name: EgressServiceAccount}}
	if err := c.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	a, b := newEgress("a", "192.0.2.0/24"), newEgress("b", "198.51.100.0/24")
	s := newEgress("s", "0.0.0.0/0")
	s.Namespace = "second"
	o := newEgress("o", "0.0.0.0/0")
	o.Namespace = "theirs"
	for _, eg := range []*skeinv1.Egress{a, b, s, o} {
		if err := c.Create(ctx, eg); err != nil {
			t.Fatal(err)
		}
	}
	state := func(wantOwners map[string][]string, wantNS []string) func() string {
		return func() string {
			for ns, want := range wantOwners {
				sa, err := getSA(c, ns)
				if want == nil {
					if !apierrors.IsNotFound(err) {
						return fmt.Sprintf("account in %s: %v, want none", ns, err)
					}
					continue
				}
				if err != nil {
					return fmt.Sprintf("account in %s: %v", ns, err)
				}
				if got := ownerNames(sa); !slices.Equal(got, want) {
					return fmt.Sprintf("account in %s owned by %v, want %v", ns, got, want)
				}
			}
			got, msg := podBindingNamespaces(c)
			if msg != "" {
				return msg
			}
			if !slices.Equal(got, wantNS) {
				return fmt.Sprintf("pod RoleBindings for the accounts of %v, want %v", got, wantNS)
			}
			return ""
		}
	}
	eventually(t, "accounts and binding", state(map[string][]string{egressNS: {"a", "b"}, "second": {"s"}}, []string{egressNS, "second", "theirs"}))
	sa, err := getSA(c, "theirs")
	if err != nil || len(sa.OwnerReferences) != 0 || len(sa.Labels) != 0 {
		t.Errorf("someone else's account was changed: %+v %v", sa, err)
	}

	// One of two Egresses goes: the account stays, with one owner.
	if err := c.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	eventually(t, "first of two deleted", state(map[string][]string{egressNS: {"b"}, "second": {"s"}}, []string{egressNS, "second", "theirs"}))
	// The last goes: so do the account and the namespace's subject.
	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "last deleted", state(map[string][]string{egressNS: nil, "second": {"s"}}, []string{"second", "theirs"}))
	// Someone else's account stays when its namespace's Egress goes.
	if err := c.Delete(ctx, o); err != nil {
		t.Fatal(err)
	}
	eventually(t, "theirs deleted", state(map[string][]string{"second": {"s"}}, []string{"second"}))
	if _, err := getSA(c, "theirs"); err != nil {
		t.Errorf("someone else's account: %v", err)
	}
	// An account deleted behind the controller's back comes back with
	// the next reconcile of an Egress there.
	sa, err = getSA(c, "second")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, sa); err != nil {
		t.Fatal(err)
	}
	updateEgress(t, c, s, func(eg *skeinv1.Egress) { eg.Spec.Destinations = []string{"203.0.113.0/24"} })
	eventually(t, "account restored", state(map[string][]string{"second": {"s"}}, []string{"second"}))
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	eventually(t, "no Egress left", state(map[string][]string{"second": nil}, nil))
}

// An API server that refuses privileged pods refuses the router
// Deployment (an event says so), but the Service, which clients resolve,
// and the routers' account are made all the same.
func TestEgressServiceWithoutRouters(t *testing.T) {
	env := kube.Start(t, kube.Options{}) // --allow-privileged=false
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egressNS}}); err != nil {
		t.Fatal(err)
	}
	startAll(t, env, Options{})
	eg := newEgress("noroute", "0.0.0.0/0")
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "service, account and a refused deployment", func() string {
		svc := &corev1.Service{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "noroute"}, svc); err != nil {
			return "service: " + err.Error()
		}
		if _, err := getSA(c, egressNS); err != nil {
			return "account: " + err.Error()
		}
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(egressNS)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Regarding.UID == eg.UID && e.Reason == ReasonEgressDeploymentFailed && strings.Contains(e.Note, "privileged") {
				return ""
			}
		}
		return fmt.Sprintf("no DeploymentFailed event naming privileged among %d", len(evs.Items))
	})
	if _, msg := getDeployment(t, c, "noroute"); msg == "" {
		t.Error("a privileged deployment was made where the API server refuses them")
	}
}

// A ClusterRoleBinding named skein-egress that binds another role (made
// by someone else) is never given the router accounts: they would get
// that role. The controller says so in an event and changes nothing.
func TestEgressBindingOfAnotherRole(t *testing.T) {
	_, c := startEgress(t, Options{})
	ctx := context.Background()
	theirs := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: EgressRBACName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "skein-test-powerful"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "someone"}},
	}
	if err := c.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	eg := newEgress("nat", "0.0.0.0/0")
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "an AccessFailed event", func() string {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(egressNS)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Regarding.UID == eg.UID && e.Reason == ReasonEgressAccessFailed && strings.Contains(e.Note, "skein-test-powerful") {
				return ""
			}
		}
		return fmt.Sprintf("no AccessFailed event naming the other role among %d", len(evs.Items))
	})
	// The rest of the Egress is made all the same.
	eventually(t, "deployment", func() string {
		_, msg := getDeployment(t, c, "nat")
		return msg
	})
	got := &rbacv1.ClusterRoleBinding{}
	if err := c.Get(ctx, client.ObjectKey{Name: EgressRBACName}, got); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got.Subjects, theirs.Subjects) {
		t.Errorf("the other role's binding got subjects %+v, want its own %+v", got.Subjects, theirs.Subjects)
	}
}

// An Egress deleted while no controller ran leaves no event to reconcile:
// when it was the last one anywhere, its namespace's subject is still
// taken out of the binding once a controller starts.
func TestEgressBindingSyncedAtStart(t *testing.T) {
	env := kube.Start(t, kube.Options{APIServerArgs: []string{"--allow-privileged=true"}})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// What the controller had made for the Egress of namespace "gone",
	// deleted while it was away.
	stale := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: EgressRBACName, Labels: egressManagedBy},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: EgressRBACName},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.ServiceAccountKind, Name: EgressServiceAccount, Namespace: "gone"},
		},
	}
	if err := c.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	startAll(t, env, Options{})
	eventually(t, "the stale subject removed", func() string {
		got, msg := bindingNamespaces(c)
		if msg != "" {
			return msg
		}
		if len(got) != 0 {
			return fmt.Sprintf("binding's namespaces %v, want none (no Egress left)", got)
		}
		return ""
	})
}

// routerClient reaches the API server as the router account of namespace
// ns (impersonated by the administrator).
func routerClient(t *testing.T, env *kube.Env, ns string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + EgressServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	c, err := kube.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// canListPods: "" when the router client may list the pods of ns ("" =
// all namespaces), else why not.
func canListPods(c client.Client, ns string) error {
	var pods corev1.PodList
	var opts []client.ListOption
	if ns != "" {
		opts = append(opts, client.InNamespace(ns))
	}
	return c.List(context.Background(), &pods, opts...)
}

// The router account reads only what its routers need: the pods of the
// namespaces its Egresses serve (the Egress's own and clientNamespaces,
// in step as they change, including a namespace made later), every
// namespace's only with "*", and its own namespace's Egresses by name;
// nothing once the last Egress is gone. With deploy/kubernetes's
// ClusterRole, as a cluster has it.
func TestEgressRouterAccountScope(t *testing.T) {
	env, c := startEgress(t, Options{})
	if out, err := env.Kubectl("apply", "-f", "../../deploy/kubernetes/egress-rbac.yaml"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ctx := context.Background()
	for _, ns := range []string{"apps", "stranger", "other"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	eg := newEgress("nat", "0.0.0.0/0")
	eg.Spec.ClientNamespaces = []string{"apps", "later"}
	theirs := newEgress("theirs", "0.0.0.0/0")
	theirs.Namespace = "other"
	for _, e := range []*skeinv1.Egress{eg, theirs} {
		if err := c.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	rc := routerClient(t, env, egressNS)
	type check struct {
		what string
		err  func() error
		ok   bool
	}
	pods := func(ns string) func() error { return func() error { return canListPods(rc, ns) } }
	getEgress := func(ns, name string) func() error {
		return func() error {
			return rc.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &skeinv1.Egress{})
		}
	}
	listEgresses := func(field string) func() error {
		return func() error {
			opts := []client.ListOption{client.InNamespace(egressNS)}
			if field != "" {
				opts = append(opts, client.MatchingFields{"metadata.name": field})
			}
			return rc.List(ctx, &skeinv1.EgressList{}, opts...)
		}
	}
	state := func(cs ...check) func() string {
		return func() string {
			var bad []string
			for _, k := range cs {
				err := k.err()
				switch {
				case k.ok && err != nil:
					bad = append(bad, fmt.Sprintf("%s: %v, want allowed", k.what, err))
				case !k.ok && !apierrors.IsForbidden(err):
					bad = append(bad, fmt.Sprintf("%s: %v, want forbidden", k.what, err))
				}
			}
			return strings.Join(bad, "; ")
		}
	}
	eventually(t, "scoped to the served namespaces", state(
		check{"list pods in its own namespace", pods(egressNS), true},
		check{"list pods in the client namespace apps", pods("apps"), true},
		check{"list pods in the unrelated namespace stranger", pods("stranger"), false},
		check{"list pods of every namespace", pods(""), false},
		check{"get its Egress", getEgress(egressNS, "nat"), true},
		check{"list its Egress by name (skein-egress's informer)", listEgresses("nat"), true},
		check{"list every Egress of its namespace", listEgresses(""), false},
		check{"get another namespace's Egress", getEgress("other", "theirs"), false},
	))

	// A client namespace made after the Egress.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "later"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a client namespace made later", state(check{"list pods in later", pods("later"), true}))

	// clientNamespaces changes: the grants follow.
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) { eg.Spec.ClientNamespaces = []string{"later"} })
	eventually(t, "apps no longer served", state(
		check{"list pods in apps", pods("apps"), false},
		check{"list pods in later", pods("later"), true},
		check{"list pods in its own namespace", pods(egressNS), true},
	))
	// "*": every namespace.
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) { eg.Spec.ClientNamespaces = []string{"*"} })
	eventually(t, "every namespace served", state(
		check{"list pods of every namespace", pods(""), true},
		check{"list pods in stranger", pods("stranger"), true},
	))
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) { eg.Spec.ClientNamespaces = nil })
	eventually(t, "back to its own namespace", state(
		check{"list pods of every namespace", pods(""), false},
		check{"list pods in stranger", pods("stranger"), false},
		check{"list pods in later", pods("later"), false},
		check{"list pods in its own namespace", pods(egressNS), true},
	))

	// The last Egress goes: so does every grant.
	if err := c.Delete(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "no Egress left", state(
		check{"list pods in its own namespace", pods(egressNS), false},
		check{"get the deleted Egress's name", getEgress(egressNS, "nat"), false},
	))
	var rbs rbacv1.RoleBindingList
	if err := c.List(ctx, &rbs, client.MatchingLabels{LabelEgressAccount: egressNS}); err != nil || len(rbs.Items) != 0 {
		t.Errorf("pod RoleBindings of %s's router account left: %d %v", egressNS, len(rbs.Items), err)
	}
}

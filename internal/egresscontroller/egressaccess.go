package egresscontroller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ctrlutil"
)

// The router pods' identity. Every Egress of a namespace runs its routers
// as the ServiceAccount EgressServiceAccount of that namespace. What that
// account may read is narrowed to what the routers of the namespace need
// (skein-egress's informers are scoped to the same):
//
//   - its Egresses: the Role EgressRBACName in the namespace (get, list,
//     watch on egresses, resourceNames = the namespace's Egresses) and
//     the RoleBinding EgressRBACName to it;
//   - the pods of each namespace an Egress there serves (its own and
//     spec.clientNamespaces): a RoleBinding "skein-egress-<egress
//     namespace>" in that namespace to the ClusterRole EgressRBACName
//     (deploy/kubernetes/egress-rbac.yaml: get, list, watch pods),
//     labelled LabelEgressAccount=<egress namespace>;
//   - with clientNamespaces "*", the pods of every namespace: the
//     ClusterRoleBinding EgressRBACName lists the accounts of the
//     namespaces holding such an Egress.
//
// The account is shared, not one per Egress: a namespace with many
// Egresses then holds one account, whose routers may read what any of
// them needs. So the account, the Role and its RoleBinding have an owner
// reference to each live Egress of their namespace (the garbage collector
// removes them after the last, should the controller be away), and the
// controller deletes them itself when the last Egress of the namespace
// goes; an account, Role or binding of these names it did not make (no
// managed-by label) is used as it is, never changed or deleted. The pod
// RoleBindings live in other namespaces, which owner references cannot
// span: the controller removes those no Egress needs any more, also once
// at start (syncBindingAtStart).
const (
	EgressServiceAccount = "skein-egress"
	EgressRBACName       = "skein-egress"
	// LabelEgressAccount is on each pod RoleBinding: the namespace whose
	// router account it grants.
	LabelEgressAccount = "skein.dev/egress-account-namespace"
)

// egressPodBindingName is the name of the RoleBinding that lets the router
// account of namespace ns read pods (in a namespace its Egresses serve).
func egressPodBindingName(ns string) string { return EgressRBACName + "-" + ns }

// egressManagedBy marks the accounts and the binding the controller made.
var egressManagedBy = map[string]string{
	"app.kubernetes.io/name":       "skein-egress",
	"app.kubernetes.io/part-of":    "skein",
	"app.kubernetes.io/managed-by": "skein-controller",
}

func managedByUs(o metav1.Object) bool {
	return o.GetLabels()["app.kubernetes.io/managed-by"] == "skein-controller"
}

// egressAccess is what the router accounts need, computed from the live
// Egresses.
type egressAccess struct {
	// here are the Egresses of each namespace.
	here map[string][]skeinv1.Egress
	// serves are the namespaces (by name) whose pods the account of each
	// namespace reads.
	serves map[string]map[string]bool
	// everywhere are the namespaces holding an Egress that serves "*".
	everywhere map[string]bool
}

func (r *Reconciler) access(ctx context.Context) (egressAccess, error) {
	var all skeinv1.EgressList
	if err := r.Client.List(ctx, &all); err != nil {
		return egressAccess{}, fmt.Errorf("list egresses: %w", err)
	}
	a := egressAccess{here: map[string][]skeinv1.Egress{}, serves: map[string]map[string]bool{}, everywhere: map[string]bool{}}
	for _, eg := range all.Items {
		if !eg.DeletionTimestamp.IsZero() {
			continue
		}
		a.here[eg.Namespace] = append(a.here[eg.Namespace], eg)
		if a.serves[eg.Namespace] == nil {
			a.serves[eg.Namespace] = map[string]bool{}
		}
		a.serves[eg.Namespace][eg.Namespace] = true
		for _, ns := range eg.Spec.ClientNamespaces {
			if ns == "*" {
				a.everywhere[eg.Namespace] = true
			} else {
				a.serves[eg.Namespace][ns] = true
			}
		}
	}
	return a, nil
}

// syncAccess makes the router account of namespace ns and its grants
// match the live Egresses there, and the ClusterRoleBinding match the
// namespaces with an Egress serving every namespace.
func (r *Reconciler) syncAccess(ctx context.Context, ns string) error {
	a, err := r.access(ctx)
	if err != nil {
		return err
	}
	here := a.here[ns]
	// Adding, the account exists before it is granted anything; removing,
	// the grants go before the account.
	if len(here) > 0 {
		if err := r.syncServiceAccount(ctx, ns, here); err != nil {
			return err
		}
	}
	errs := []error{
		r.syncEgressRole(ctx, ns, here),
		r.syncPodBindings(ctx, ns, a.serves[ns]),
		r.syncBinding(ctx, a.everywhere),
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if len(here) == 0 {
		return r.syncServiceAccount(ctx, ns, nil)
	}
	return nil
}

// syncBindingAtStart makes the bindings match the Egresses once the
// controller leads: an Egress deleted while no controller ran leaves no
// event, and nothing else would take its grants away (the account there
// is gone with its owners, but one made again under that name would
// inherit them). Errors are retried with backoff until ctx ends.
func (r *Reconciler) syncBindingAtStart(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for {
		err := r.syncAllBindings(ctx)
		if err == nil {
			return nil
		}
		ctrlutil.ReconcileErrors("egress-binding").Inc()
		log.FromContext(ctx).Error(err, "sync the egress routers' bindings at start; retrying", "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}

// syncAllBindings makes the ClusterRoleBinding list the namespaces
// holding a live Egress that serves every namespace, and removes the pod
// RoleBindings no live Egress needs.
func (r *Reconciler) syncAllBindings(ctx context.Context) error {
	a, err := r.access(ctx)
	if err != nil {
		return err
	}
	var list rbacv1.RoleBindingList
	if err := r.reader().List(ctx, &list, client.HasLabels{LabelEgressAccount}, client.MatchingLabels(egressManagedBy)); err != nil {
		return fmt.Errorf("list the router accounts' pod RoleBindings: %w", err)
	}
	var errs []error
	for i := range list.Items {
		rb := &list.Items[i]
		owner := rb.Labels[LabelEgressAccount]
		if rb.Name == egressPodBindingName(owner) && a.serves[owner][rb.Namespace] {
			continue
		}
		errs = append(errs, r.deleteBinding(ctx, rb))
	}
	errs = append(errs, r.syncBinding(ctx, a.everywhere))
	return errors.Join(errs...)
}

func (r *Reconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

func (r *Reconciler) syncServiceAccount(ctx context.Context, ns string, egs []skeinv1.Egress) error {
	sa := &corev1.ServiceAccount{}
	err := r.reader().Get(ctx, client.ObjectKey{Namespace: ns, Name: EgressServiceAccount}, sa)
	switch {
	case apierrors.IsNotFound(err):
		sa = nil
	case err != nil:
		return fmt.Errorf("get ServiceAccount %s/%s: %w", ns, EgressServiceAccount, err)
	}
	if sa != nil && !managedByUs(sa) {
		return nil // someone else's: used, not changed
	}
	if len(egs) == 0 {
		if sa == nil {
			return nil
		}
		err := r.Client.Delete(ctx, sa, client.Preconditions{UID: &sa.UID, ResourceVersion: &sa.ResourceVersion})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ServiceAccount %s/%s of the last Egress: %w", ns, EgressServiceAccount, err)
		}
		return nil
	}
	owners := ownersOf(egs)
	if sa == nil {
		sa = &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: EgressServiceAccount, Labels: mergeLabels(nil, egressManagedBy), OwnerReferences: owners,
		}}
		if err := r.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ServiceAccount %s/%s: %w", ns, EgressServiceAccount, err)
		}
		return nil
	}
	if equality.Semantic.DeepEqual(sa.OwnerReferences, owners) {
		return nil
	}
	sa.OwnerReferences = owners
	if err := r.Client.Update(ctx, sa); err != nil {
		return fmt.Errorf("update owners of ServiceAccount %s/%s: %w", ns, EgressServiceAccount, err)
	}
	return nil
}

func (r *Reconciler) syncBinding(ctx context.Context, namespaces map[string]bool) error {
	var subjects []rbacv1.Subject
	for ns := range namespaces {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: EgressServiceAccount, Namespace: ns})
	}
	slices.SortFunc(subjects, func(a, b rbacv1.Subject) int { return cmpString(a.Namespace, b.Namespace) })
	role := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: EgressRBACName}
	crb := &rbacv1.ClusterRoleBinding{}
	err := r.reader().Get(ctx, client.ObjectKey{Name: EgressRBACName}, crb)
	if apierrors.IsNotFound(err) {
		if len(subjects) == 0 {
			return nil
		}
		crb = &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: EgressRBACName, Labels: mergeLabels(nil, egressManagedBy)},
			RoleRef:    role,
			Subjects:   subjects,
		}
		if err := r.Client.Create(ctx, crb); err != nil {
			return fmt.Errorf("create ClusterRoleBinding %s: %w", EgressRBACName, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get ClusterRoleBinding %s: %w", EgressRBACName, err)
	}
	// A binding of this name to another role (its role cannot be changed)
	// would give the router accounts that role: left alone.
	if crb.RoleRef != role {
		return fmt.Errorf("ClusterRoleBinding %s binds %s %s, not ClusterRole %s: router accounts not added (delete it, and the controller makes its own)",
			EgressRBACName, crb.RoleRef.Kind, crb.RoleRef.Name, EgressRBACName)
	}
	if equality.Semantic.DeepEqual(crb.Subjects, subjects) || len(crb.Subjects) == 0 && len(subjects) == 0 {
		return nil
	}
	crb.Subjects = subjects
	if err := r.Client.Update(ctx, crb); err != nil {
		return fmt.Errorf("update subjects of ClusterRoleBinding %s: %w", EgressRBACName, err)
	}
	return nil
}

// ownersOf are the owner references of the account, Role and RoleBinding
// of a namespace: each of its Egresses, sorted by name.
func ownersOf(egs []skeinv1.Egress) []metav1.OwnerReference {
	owners := make([]metav1.OwnerReference, 0, len(egs))
	for _, eg := range egs {
		owners = append(owners, metav1.OwnerReference{
			APIVersion: skeinv1.GroupVersion.String(), Kind: "Egress", Name: eg.Name, UID: eg.UID,
		})
	}
	slices.SortFunc(owners, func(a, b metav1.OwnerReference) int { return cmpString(a.Name, b.Name) })
	return owners
}

func routerSubject(ns string) []rbacv1.Subject {
	return []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: EgressServiceAccount, Namespace: ns}}
}

// syncEgressRole lets the router account of ns read the Egresses of ns
// by name (the Role EgressRBACName and its RoleBinding), or removes both
// when egs is empty.
func (r *Reconciler) syncEgressRole(ctx context.Context, ns string, egs []skeinv1.Egress) error {
	role := &rbacv1.Role{}
	err := r.reader().Get(ctx, client.ObjectKey{Namespace: ns, Name: EgressRBACName}, role)
	switch {
	case apierrors.IsNotFound(err):
		role = nil
	case err != nil:
		return fmt.Errorf("get Role %s/%s: %w", ns, EgressRBACName, err)
	}
	rb := &rbacv1.RoleBinding{}
	err = r.reader().Get(ctx, client.ObjectKey{Namespace: ns, Name: EgressRBACName}, rb)
	switch {
	case apierrors.IsNotFound(err):
		rb = nil
	case err != nil:
		return fmt.Errorf("get RoleBinding %s/%s: %w", ns, EgressRBACName, err)
	}
	if len(egs) == 0 {
		var errs []error
		if rb != nil && managedByUs(rb) {
			errs = append(errs, r.deleteBinding(ctx, rb))
		}
		if role != nil && managedByUs(role) {
			err := r.Client.Delete(ctx, role, client.Preconditions{UID: &role.UID, ResourceVersion: &role.ResourceVersion})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete Role %s/%s of the last Egress: %w", ns, EgressRBACName, err))
			}
		}
		return errors.Join(errs...)
	}
	names := make([]string, 0, len(egs))
	for _, eg := range egs {
		names = append(names, eg.Name)
	}
	slices.Sort(names)
	rules := []rbacv1.PolicyRule{{
		APIGroups: []string{skeinv1.GroupVersion.Group}, Resources: []string{"egresses"},
		ResourceNames: names, Verbs: []string{"get", "list", "watch"},
	}}
	owners := ownersOf(egs)
	switch {
	case role == nil:
		role = &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: EgressRBACName, Labels: mergeLabels(nil, egressManagedBy), OwnerReferences: owners},
			Rules:      rules,
		}
		if err := r.Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create Role %s/%s: %w", ns, EgressRBACName, err)
		}
	case !managedByUs(role):
		// Someone else's: used, not changed.
	case !equality.Semantic.DeepEqual(role.Rules, rules) || !equality.Semantic.DeepEqual(role.OwnerReferences, owners):
		role.Rules, role.OwnerReferences = rules, owners
		if err := r.Client.Update(ctx, role); err != nil {
			return fmt.Errorf("update Role %s/%s: %w", ns, EgressRBACName, err)
		}
	}
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: EgressRBACName}
	want := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: EgressRBACName, Labels: mergeLabels(nil, egressManagedBy), OwnerReferences: owners},
		RoleRef:    ref, Subjects: routerSubject(ns),
	}
	return r.writeBinding(ctx, rb, want)
}

// writeBinding makes the RoleBinding want, given what is there (have;
// nil: none). One of another's is left alone; one of ours with another
// role (which cannot be changed) is made again.
func (r *Reconciler) writeBinding(ctx context.Context, have, want *rbacv1.RoleBinding) error {
	id := want.Namespace + "/" + want.Name
	if have != nil && !managedByUs(have) {
		return nil
	}
	if have != nil && have.RoleRef != want.RoleRef {
		if err := r.deleteBinding(ctx, have); err != nil {
			return err
		}
		have = nil
	}
	if have == nil {
		err := r.Client.Create(ctx, want)
		switch {
		case err == nil, apierrors.IsAlreadyExists(err):
			return nil
		case apierrors.IsNotFound(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			// A client namespace not there (yet): its creation
			// reconciles the Egresses that name it.
			return nil
		}
		return fmt.Errorf("create RoleBinding %s: %w", id, err)
	}
	if equality.Semantic.DeepEqual(have.Subjects, want.Subjects) && equality.Semantic.DeepEqual(have.OwnerReferences, want.OwnerReferences) &&
		equality.Semantic.DeepEqual(have.Labels, want.Labels) {
		return nil
	}
	have.Subjects, have.OwnerReferences, have.Labels = want.Subjects, want.OwnerReferences, want.Labels
	if err := r.Client.Update(ctx, have); err != nil {
		return fmt.Errorf("update RoleBinding %s: %w", id, err)
	}
	return nil
}

func (r *Reconciler) deleteBinding(ctx context.Context, rb *rbacv1.RoleBinding) error {
	err := r.Client.Delete(ctx, rb, client.Preconditions{UID: &rb.UID, ResourceVersion: &rb.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete RoleBinding %s/%s: %w", rb.Namespace, rb.Name, err)
	}
	return nil
}

// syncPodBindings lets the router account of ns read the pods of exactly
// the namespaces in serves: a RoleBinding to the ClusterRole
// EgressRBACName in each, and none elsewhere.
func (r *Reconciler) syncPodBindings(ctx context.Context, ns string, serves map[string]bool) error {
	var list rbacv1.RoleBindingList
	if err := r.reader().List(ctx, &list, client.MatchingLabels(mergeLabels(map[string]string{LabelEgressAccount: ns}, egressManagedBy))); err != nil {
		return fmt.Errorf("list the pod RoleBindings of the router account of %s: %w", ns, err)
	}
	name := egressPodBindingName(ns)
	have := map[string]*rbacv1.RoleBinding{}
	var errs []error
	for i := range list.Items {
		rb := &list.Items[i]
		if rb.Name == name && serves[rb.Namespace] {
			have[rb.Namespace] = rb
			continue
		}
		errs = append(errs, r.deleteBinding(ctx, rb))
	}
	targets := make([]string, 0, len(serves))
	for n := range serves {
		targets = append(targets, n)
	}
	slices.Sort(targets)
	for _, n := range targets {
		cur := have[n]
		if cur == nil {
			// Perhaps one of that name without our labels (someone
			// else's, or ours with labels removed): writeBinding decides.
			got := &rbacv1.RoleBinding{}
			err := r.reader().Get(ctx, client.ObjectKey{Namespace: n, Name: name}, got)
			switch {
			case err == nil:
				cur = got
			case !apierrors.IsNotFound(err):
				errs = append(errs, fmt.Errorf("get RoleBinding %s/%s: %w", n, name, err))
				continue
			}
		}
		want := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: name,
				Labels: mergeLabels(map[string]string{LabelEgressAccount: ns}, egressManagedBy)},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: EgressRBACName},
			Subjects: routerSubject(ns),
		}
		errs = append(errs, r.writeBinding(ctx, cur, want))
	}
	return errors.Join(errs...)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Router pod defaults beyond the container's command.
const (
	// EgressMetricsPort is skein-egress's --metrics-addr port: /metrics,
	// /healthz and /readyz.
	EgressMetricsPort = 9386
)

// egressEnv is the router's view of its pod, through the downward API:
// its addresses (the local ends of the tunnels) and identity.
func egressEnv() []corev1.EnvVar {
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}}
	}
	return []corev1.EnvVar{
		field("POD_IP", "status.podIP"),
		field("POD_IPS", "status.podIPs"),
		field("POD_NAME", "metadata.name"),
		field("POD_NAMESPACE", "metadata.namespace"),
	}
}

// mergeEnv returns over with each variable of base it does not set.
func mergeEnv(base, over []corev1.EnvVar) []corev1.EnvVar {
	out := slices.Clone(over)
	for _, b := range base {
		if !slices.ContainsFunc(over, func(o corev1.EnvVar) bool { return o.Name == b.Name }) {
			out = append(out, b)
		}
	}
	return out
}

// egressSecurityContext: skein-egress programs its pod's network
// namespace (tunnels, FoU ports, routes, nftables: NET_ADMIN) and sets
// net.ipv4.ip_forward, rp_filter and IPv6 forwarding there. Container
// runtimes mount /proc/sys read-only unless the container is privileged,
// and a kubelet refuses those sysctls in a pod's securityContext.sysctls
// unless each node allows them as unsafe; so the router runs privileged.
func egressSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		Privileged:   ptr.To(true),
		Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}},
	}
}

// egressReadiness: a router takes traffic once its data plane holds a
// tunnel for every client it knows of.
func egressReadiness() *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/readyz", Port: intstr.FromInt32(EgressMetricsPort),
		}},
		PeriodSeconds: 5,
	}
}

// PodTemplate is the router pod template the controller writes for eg
// (for skein-egress's test that its command line agrees).
func (r *Reconciler) PodTemplate(eg *skeinv1.Egress) corev1.PodTemplateSpec {
	return r.podTemplate(eg)
}

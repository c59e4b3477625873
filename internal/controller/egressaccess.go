package controller

import (
	"context"
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
)

// The router pods' identity. Every Egress of a namespace runs its routers
// as the ServiceAccount EgressServiceAccount of that namespace, and the
// ClusterRoleBinding EgressRBACName gives those accounts the ClusterRole
// of the same name (deploy/kubernetes/egress-rbac.yaml: read pods and
// egresses in every namespace, since clients of an Egress may live
// anywhere).
//
// The account is shared, not one per Egress: the permissions are the same
// for all, and a namespace with many Egresses then holds one account. So
// it has an owner reference to each live Egress of its namespace (the
// garbage collector removes it after the last, should the controller be
// away), and the controller deletes it itself when the last Egress of the
// namespace goes; an account of that name it did not make (no
// managed-by label) is used as it is, never changed or deleted. The
// binding lists the accounts of the namespaces that hold an Egress.
const (
	EgressServiceAccount = "skein-egress"
	EgressRBACName       = "skein-egress"
)

// egressManagedBy marks the accounts and the binding the controller made.
var egressManagedBy = map[string]string{
	"app.kubernetes.io/name":       "skein-egress",
	"app.kubernetes.io/part-of":    "skein",
	"app.kubernetes.io/managed-by": "skein-controller",
}

func managedByUs(o metav1.Object) bool {
	return o.GetLabels()["app.kubernetes.io/managed-by"] == "skein-controller"
}

// syncAccess makes the router account of namespace ns match the live
// Egresses there, and the binding match the namespaces with any.
func (r *EgressReconciler) syncAccess(ctx context.Context, ns string) error {
	var all skeinv1.EgressList
	if err := r.Client.List(ctx, &all); err != nil {
		return fmt.Errorf("list egresses: %w", err)
	}
	var here []skeinv1.Egress
	namespaces := map[string]bool{}
	for _, eg := range all.Items {
		if !eg.DeletionTimestamp.IsZero() {
			continue
		}
		namespaces[eg.Namespace] = true
		if eg.Namespace == ns {
			here = append(here, eg)
		}
	}
	// Account first, binding last: adding, the pods' identity exists
	// before it is granted; removing, the grant goes with the account.
	if err := r.syncServiceAccount(ctx, ns, here); err != nil {
		return err
	}
	return r.syncBinding(ctx, namespaces)
}

// syncBindingAtStart makes the binding match the Egresses once the
// controller leads: an Egress deleted while no controller ran leaves no
// event, and when it was the last one anywhere no later reconcile would
// take its namespace's subject out (the account there is gone with its
// owners, but one made again under that name would inherit the grant).
// Errors are retried with backoff until ctx ends.
func (r *EgressReconciler) syncBindingAtStart(ctx context.Context) error {
	wait := 100 * time.Millisecond
	for {
		err := r.syncAllBindings(ctx)
		if err == nil {
			return nil
		}
		reconcileErrors.WithLabelValues("egress-binding").Inc()
		log.FromContext(ctx).Error(err, "sync the egress routers' binding at start; retrying", "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}

// syncAllBindings makes the binding list the namespaces holding a live
// Egress.
func (r *EgressReconciler) syncAllBindings(ctx context.Context) error {
	var all skeinv1.EgressList
	if err := r.Client.List(ctx, &all); err != nil {
		return fmt.Errorf("list egresses: %w", err)
	}
	namespaces := map[string]bool{}
	for _, eg := range all.Items {
		if eg.DeletionTimestamp.IsZero() {
			namespaces[eg.Namespace] = true
		}
	}
	return r.syncBinding(ctx, namespaces)
}

func (r *EgressReconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

func (r *EgressReconciler) syncServiceAccount(ctx context.Context, ns string, egs []skeinv1.Egress) error {
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
	owners := make([]metav1.OwnerReference, 0, len(egs))
	for _, eg := range egs {
		owners = append(owners, metav1.OwnerReference{
			APIVersion: skeinv1.GroupVersion.String(), Kind: "Egress", Name: eg.Name, UID: eg.UID,
		})
	}
	slices.SortFunc(owners, func(a, b metav1.OwnerReference) int { return cmpString(a.Name, b.Name) })
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

func (r *EgressReconciler) syncBinding(ctx context.Context, namespaces map[string]bool) error {
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
func (r *EgressReconciler) PodTemplate(eg *skeinv1.Egress) corev1.PodTemplateSpec {
	return r.podTemplate(eg)
}

package egresscontroller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/ctrlutil"
)

// DefaultImage is Options.EgressImage's default: the image of the
// skein manifests, which holds skein-egress.
const DefaultImage = "skein:dev"

// Event reasons of an Egress.
const (
	ReasonEgressDeploymentFailed = "DeploymentFailed"
	ReasonEgressServiceFailed    = "ServiceFailed"
	ReasonEgressAccessFailed     = "AccessFailed"
)

// Reconciler runs each Egress as a Deployment of router pods and a
// UDP Service in front of them, both named after the Egress and owned by
// it, and reports the Deployment's replicas and pod selector in the
// Egress's status (what the scale subresource reads).
type Reconciler struct {
	Client client.Client
	// Reader reads what the controller does not cache (the router pods'
	// ServiceAccount and ClusterRoleBinding, so that it needs no list or
	// watch of every account and binding); nil means Client.
	Reader client.Reader
	Scheme *runtime.Scheme
	// Recorder reports errors as events on the Egress; nil records none.
	Recorder events.EventRecorder
	// Image of the router pods; "" means DefaultImage.
	Image string
}

// SetupWithManager registers the reconciler with mgr: it runs for an
// Egress and for every change of a Deployment or Service it owns; and,
// once mgr leads, the routers' binding is synced with the Egresses there
// are.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	err := ctrl.NewControllerManagedBy(mgr).
		For(&skeinv1.Egress{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		// A namespace's AnnotationAllowCustomEgressPods given or taken
		// away: its Egresses are checked again.
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.egressesOfNamespace)).
		Named("egress").
		WithOptions(ctrlutil.QueueOptions()).
		Complete(ctrlutil.CountErrors("egress", r))
	if err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(r.syncBindingAtStart))
}

// egressesOfNamespace lists the Egresses of namespace obj, and those that
// serve it (spec.clientNamespaces names it): a client namespace made
// after its Egress gets the routers' pod RoleBinding then.
func (r *Reconciler) egressesOfNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	var list skeinv1.EgressList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, eg := range list.Items {
		if eg.Namespace == obj.GetName() || slices.Contains(eg.Spec.ClientNamespaces, obj.GetName()) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&eg)})
		}
	}
	return reqs
}

// EgressSelector is the label set of an Egress's router pods, the
// Deployment's selector and the Service's.
func EgressSelector(eg *skeinv1.Egress) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":      "skein-egress",
		"app.kubernetes.io/component": "egress-router",
		skeinv1.LabelEgress:           eg.Name,
	}
}

// Reconcile brings one Egress's Deployment, Service and status in step
// with its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	eg := &skeinv1.Egress{}
	if err := r.Client.Get(ctx, req.NamespacedName, eg); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		// Gone: its routers' account may have been its namespace's last.
		return ctrl.Result{}, r.syncAccess(ctx, req.Namespace)
	}
	if !eg.DeletionTimestamp.IsZero() {
		// The garbage collector removes what it owns.
		return ctrl.Result{}, r.syncAccess(ctx, req.Namespace)
	}
	eg = eg.DeepCopy()

	// Each part is written even when another fails: the Service is what
	// clients resolve and does not need the router pods (a Deployment the
	// API server refuses, say privileged pods not allowed, must not leave
	// clients without it); the routers' account is made before their
	// Deployment, whose pods need it.
	var errs []error
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: eg.Name, Namespace: eg.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, svc, func() error {
		return r.mutateService(eg, svc)
	}); err != nil {
		r.event(eg, ReasonEgressServiceFailed, "write Service %s: %v", eg.Name, err)
		errs = append(errs, fmt.Errorf("write Service: %w", err))
	}
	if err := r.syncAccess(ctx, eg.Namespace); err != nil {
		r.event(eg, ReasonEgressAccessFailed, "%v", err)
		errs = append(errs, err)
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: eg.Name, Namespace: eg.Namespace}}
	if err := r.templateAllowed(ctx, eg, r.image()); err != nil {
		// The routers are not written (nor changed, if they run) until
		// the template is fixed or its namespace allowed: an edit of
		// either reconciles again.
		r.event(eg, ReasonEgressTemplateRefused, "%v", err)
		if err := errors.Join(errs...); err != nil {
			return ctrlutil.RequeueOnConflict(err, "reconcile egress %s/%s", eg.Namespace, eg.Name)
		}
		return ctrl.Result{}, nil
	}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, dep, func() error {
		return r.mutateDeployment(eg, dep)
	}); err != nil {
		r.event(eg, ReasonEgressDeploymentFailed, "write Deployment %s: %v", eg.Name, err)
		errs = append(errs, fmt.Errorf("write Deployment: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return ctrlutil.RequeueOnConflict(err, "reconcile egress %s/%s", eg.Namespace, eg.Name)
	}

	st := skeinv1.EgressStatus{
		Replicas:           dep.Status.Replicas,
		Selector:           labels.SelectorFromSet(EgressSelector(eg)).String(),
		ObservedGeneration: eg.Generation,
	}
	if !equality.Semantic.DeepEqual(st, eg.Status) {
		eg.Status = st
		if err := r.Client.Status().Update(ctx, eg); err != nil {
			return ctrlutil.RequeueOnConflict(err, "update status of egress %s/%s", eg.Namespace, eg.Name)
		}
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) event(eg *skeinv1.Egress, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(eg, nil, corev1.EventTypeWarning, reason, "Reconcile", format, args...)
	}
}

// mutateDeployment makes dep what eg asks for, keeping what the API
// server filled in where eg says nothing.
func (r *Reconciler) mutateDeployment(eg *skeinv1.Egress, dep *appsv1.Deployment) error {
	sel := EgressSelector(eg)
	dep.Labels = mergeLabels(dep.Labels, sel)
	if dep.Spec.Selector == nil { // immutable once made
		dep.Spec.Selector = &metav1.LabelSelector{MatchLabels: sel}
	}
	dep.Spec.Replicas = ptr.To(ptr.Deref(eg.Spec.Replicas, 1))
	if eg.Spec.Strategy != nil {
		dep.Spec.Strategy = *eg.Spec.Strategy.DeepCopy()
	} else if def := defaultStrategy(); !equality.Semantic.DeepEqual(dep.Spec.Strategy, def) {
		// Spelled out as the API server defaults it, so that a strategy
		// removed from the Egress goes (its parameters too) and an
		// unchanged one is not written again.
		dep.Spec.Strategy = def
	}
	tmpl := r.podTemplate(eg)
	// The API server fills in defaults, so the template read back never
	// equals the one written. A hash of what was written notices any change
	// of the Egress (a field removed too); DeepDerivative notices fields
	// edited in the Deployment behind the controller's back.
	sum, err := templateHash(tmpl)
	if err != nil {
		return err
	}
	if dep.Annotations[annotationTemplateHash] != sum || !equality.Semantic.DeepDerivative(tmpl, dep.Spec.Template) {
		dep.Spec.Template = tmpl
		if dep.Annotations == nil {
			dep.Annotations = map[string]string{}
		}
		dep.Annotations[annotationTemplateHash] = sum
	}
	return controllerutil.SetControllerReference(eg, dep, r.Scheme)
}

// defaultStrategy is a Deployment's strategy as the API server defaults
// it: a rolling update, 25% unavailable, 25% surge.
func defaultStrategy() appsv1.DeploymentStrategy {
	quarter := intstr.FromString("25%")
	return appsv1.DeploymentStrategy{
		Type:          appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(quarter), MaxSurge: ptr.To(quarter)},
	}
}

// podTemplate is the router pod template of eg: the defaults, with
// spec.template's overrides merged in.
func (r *Reconciler) podTemplate(eg *skeinv1.Egress) corev1.PodTemplateSpec {
	image := r.image()
	var over skeinv1.EgressPodTemplate
	if eg.Spec.Template != nil {
		over = *eg.Spec.Template.DeepCopy()
	}
	t := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels:      mergeLabels(over.Metadata.Labels, EgressSelector(eg)),
			Annotations: over.Metadata.Annotations,
		},
		Spec: over.Spec,
	}
	base := corev1.Container{
		Name:    skeinv1.EgressContainerName,
		Image:   image,
		Command: []string{"skein-egress"},
		Args:    []string{"--egress-name", eg.Name, "--egress-namespace", eg.Namespace},
		Ports: []corev1.ContainerPort{{
			Name: "fou", ContainerPort: skeinv1.EgressFoUPort, Protocol: corev1.ProtocolUDP,
		}},
		Env:             egressEnv(),
		SecurityContext: egressSecurityContext(),
		ReadinessProbe:  egressReadiness(),
	}
	if t.Spec.ServiceAccountName == "" {
		t.Spec.ServiceAccountName = EgressServiceAccount
	}
	merged := false
	for i := range t.Spec.Containers {
		c := &t.Spec.Containers[i]
		if c.Name != skeinv1.EgressContainerName {
			continue
		}
		merged = true
		if c.Image == "" {
			c.Image = base.Image
		}
		if len(c.Command) == 0 {
			c.Command = base.Command
		}
		if len(c.Args) == 0 {
			c.Args = base.Args
		}
		if len(c.Ports) == 0 {
			c.Ports = base.Ports
		}
		if c.SecurityContext == nil {
			c.SecurityContext = base.SecurityContext
		}
		if c.ReadinessProbe == nil {
			c.ReadinessProbe = base.ReadinessProbe
		}
		c.Env = mergeEnv(base.Env, c.Env)
	}
	if !merged {
		t.Spec.Containers = append([]corev1.Container{base}, t.Spec.Containers...)
	}
	return t
}

// image is the routers' image: --egress-image, or DefaultImage.
func (r *Reconciler) image() string {
	if r.Image == "" {
		return DefaultImage
	}
	return r.Image
}

// mutateService makes svc the UDP front of eg's routers; the API server
// keeps its ClusterIPs.
func (r *Reconciler) mutateService(eg *skeinv1.Egress, svc *corev1.Service) error {
	svc.Labels = mergeLabels(svc.Labels, EgressSelector(eg))
	svc.Spec.Selector = EgressSelector(eg)
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	// PreferDualStack: on a dual-stack cluster the Service has a ClusterIP
	// of each family, and IPv6 clients need the IPv6 one for their
	// tunnels. A single-stack Service (edited so, or one of this name
	// adopted) is turned back: the API server then adds the other family.
	// RequireDualStack, set by hand, is kept.
	if p := svc.Spec.IPFamilyPolicy; p == nil || *p == corev1.IPFamilyPolicySingleStack {
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	}
	svc.Spec.Ports = []corev1.ServicePort{{
		Name:       "fou",
		Protocol:   corev1.ProtocolUDP,
		Port:       skeinv1.EgressFoUPort,
		TargetPort: intstr.FromInt32(skeinv1.EgressFoUPort),
	}}
	aff := eg.Spec.SessionAffinity
	if aff == "" {
		aff = corev1.ServiceAffinityClientIP
	}
	svc.Spec.SessionAffinity = aff
	switch {
	case aff != corev1.ServiceAffinityClientIP:
		svc.Spec.SessionAffinityConfig = nil
	case eg.Spec.SessionAffinityConfig != nil:
		svc.Spec.SessionAffinityConfig = eg.Spec.SessionAffinityConfig.DeepCopy()
	default:
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{
			ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(corev1.DefaultClientIPServiceAffinitySeconds)},
		}
	}
	return controllerutil.SetControllerReference(eg, svc, r.Scheme)
}

// annotationTemplateHash on an Egress's Deployment is templateHash of
// the pod template the controller last wrote.
const annotationTemplateHash = "egress.skein.dev/template-hash"

func templateHash(t corev1.PodTemplateSpec) (string, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("encode pod template: %w", err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:12]), nil
}

// mergeLabels returns a copy of base with extra set over it.
func mergeLabels(base, extra map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(extra))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

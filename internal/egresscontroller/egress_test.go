package egresscontroller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/kube"
)

const egressNS = "egress-test"

// startEgress runs the API server and every reconciler, with a namespace
// for Egresses.
func startEgress(t *testing.T, opts Options) (*kube.Env, client.Client) {
	t.Helper()
	// Router pods are privileged (see egressSecurityContext), as the API
	// servers of clusters running a CNI allow.
	env := kube.Start(t, kube.Options{APIServerArgs: []string{"--allow-privileged=true"}})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egressNS}}); err != nil {
		t.Fatal(err)
	}
	startAll(t, env, opts)
	return env, c
}

func newEgress(name string, dests ...string) *skeinv1.Egress {
	return &skeinv1.Egress{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: egressNS},
		Spec:       skeinv1.EgressSpec{Destinations: dests},
	}
}

// ownedBy complains unless o has eg as its controlling owner.
func ownedBy(o client.Object, eg *skeinv1.Egress) string {
	ref := metav1.GetControllerOf(o)
	if ref == nil {
		return fmt.Sprintf("%s has no controller owner (%v)", o.GetName(), o.GetOwnerReferences())
	}
	if ref.UID != eg.UID || ref.Kind != "Egress" || ref.APIVersion != skeinv1.GroupVersion.String() || !ptr.Deref(ref.BlockOwnerDeletion, false) {
		return fmt.Sprintf("%s's controller owner is %+v, want Egress %s uid %s blocking deletion", o.GetName(), *ref, eg.Name, eg.UID)
	}
	return ""
}

func getDeployment(t *testing.T, c client.Client, name string) (*appsv1.Deployment, string) {
	t.Helper()
	dep := &appsv1.Deployment{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: egressNS, Name: name}, dep); err != nil {
		return nil, err.Error()
	}
	return dep, ""
}

func routerContainer(dep *appsv1.Deployment) *corev1.Container {
	for i := range dep.Spec.Template.Spec.Containers {
		if c := &dep.Spec.Template.Spec.Containers[i]; c.Name == skeinv1.EgressContainerName {
			return c
		}
	}
	return nil
}

func TestEgressMakesDeploymentAndService(t *testing.T) {
	env, c := startEgress(t, Options{EgressImage: "registry.example/skein:v1"})
	ctx := context.Background()
	eg := newEgress("nat", "0.0.0.0/0", "2001:db8::/32")
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	// The CRD's defaults.
	if ptr.Deref(eg.Spec.Replicas, 0) != 1 || eg.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || eg.Spec.FoUSourcePort != skeinv1.FoUSourcePortFixed {
		t.Errorf("defaults: replicas %d, sessionAffinity %q, fouSourcePort %q; want 1, ClientIP, Fixed",
			ptr.Deref(eg.Spec.Replicas, 0), eg.Spec.SessionAffinity, eg.Spec.FoUSourcePort)
	}

	var dep *appsv1.Deployment
	eventually(t, "deployment", func() string {
		var msg string
		if dep, msg = getDeployment(t, c, "nat"); msg != "" {
			return msg
		}
		return ownedBy(dep, eg)
	})
	sel := EgressSelector(eg)
	if got := ptr.Deref(dep.Spec.Replicas, -1); got != 1 {
		t.Errorf("deployment replicas %d, want 1", got)
	}
	for k, v := range sel {
		if dep.Spec.Selector.MatchLabels[k] != v || dep.Spec.Template.Labels[k] != v {
			t.Errorf("label %s=%s missing from selector %v or pod labels %v", k, v, dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)
		}
	}
	ctr := routerContainer(dep)
	if ctr == nil {
		t.Fatalf("no container %q in %+v", skeinv1.EgressContainerName, dep.Spec.Template.Spec.Containers)
	}
	wantArgs := []string{"--egress-name", "nat", "--egress-namespace", egressNS}
	if ctr.Image != "registry.example/skein:v1" || !slices.Equal(ctr.Command, []string{"skein-egress"}) || !slices.Equal(ctr.Args, wantArgs) {
		t.Errorf("router container image %q command %q args %q; want the --egress-image, skein-egress, %q", ctr.Image, ctr.Command, ctr.Args, wantArgs)
	}
	if len(ctr.Ports) != 1 || ctr.Ports[0].ContainerPort != 5555 || ctr.Ports[0].Protocol != corev1.ProtocolUDP {
		t.Errorf("router ports %+v, want UDP 5555", ctr.Ports)
	}

	svc := &corev1.Service{}
	eventually(t, "service", func() string {
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "nat"}, svc); err != nil {
			return err.Error()
		}
		return ownedBy(svc, eg)
	})
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 5555 || svc.Spec.Ports[0].Protocol != corev1.ProtocolUDP ||
		svc.Spec.Ports[0].TargetPort.IntValue() != 5555 {
		t.Errorf("service ports %+v, want UDP 5555 -> 5555", svc.Spec.Ports)
	}
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || svc.Spec.SessionAffinityConfig == nil ||
		ptr.Deref(svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds, 0) != corev1.DefaultClientIPServiceAffinitySeconds {
		t.Errorf("service affinity %q %+v, want ClientIP with the default timeout", svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig)
	}
	for k, v := range sel {
		if svc.Spec.Selector[k] != v {
			t.Errorf("service selector %v lacks %s=%s", svc.Spec.Selector, k, v)
		}
	}
	if svc.Spec.ClusterIP == "" {
		t.Error("service has no ClusterIP")
	}

	// Status: the selector at once; replicas follow the Deployment's
	// status (no kube-controller-manager here: write it as it would).
	eventually(t, "egress status selector", func() string {
		if err := c.Get(ctx, client.ObjectKeyFromObject(eg), eg); err != nil {
			return err.Error()
		}
		if want := "app.kubernetes.io/component=egress-router,app.kubernetes.io/name=skein-egress,egress.skein.dev/name=nat"; eg.Status.Selector != want {
			return fmt.Sprintf("selector %q, want %q", eg.Status.Selector, want)
		}
		return ""
	})
	dep.Status.Replicas = 1
	if err := c.Status().Update(ctx, dep); err != nil {
		t.Fatal(err)
	}
	eventually(t, "egress status replicas", func() string {
		if err := c.Get(ctx, client.ObjectKeyFromObject(eg), eg); err != nil {
			return err.Error()
		}
		if eg.Status.Replicas != 1 {
			return fmt.Sprintf("status.replicas %d", eg.Status.Replicas)
		}
		return ""
	})

	// The printed columns and shortName work through kubectl.
	out, err := env.Kubectl("get", "skegress", "-n", egressNS, "nat", "-o", "jsonpath={.status.selector}")
	if err != nil || !strings.Contains(string(out), "egress.skein.dev/name=nat") {
		t.Errorf("kubectl get skegress: %v: %s", err, out)
	}

	// Level-triggered: a Deployment or Service deleted behind the
	// controller's back comes back (the Service keeps no ClusterIP).
	if err := c.Delete(ctx, dep); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deployment and service recreated", func() string {
		d, msg := getDeployment(t, c, "nat")
		if msg != "" {
			return msg
		}
		if d.UID == dep.UID {
			return "old deployment still there"
		}
		s := &corev1.Service{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "nat"}, s); err != nil {
			return err.Error()
		}
		if s.UID == svc.UID {
			return "old service still there"
		}
		return ""
	})
}

func TestEgressScale(t *testing.T) {
	env, c := startEgress(t, Options{})
	ctx := context.Background()
	eg := newEgress("scaled", "192.0.2.0/24")
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	replicas := func(want int32) func() string {
		return func() string {
			dep, msg := getDeployment(t, c, "scaled")
			if msg != "" {
				return msg
			}
			if got := ptr.Deref(dep.Spec.Replicas, -1); got != want {
				return fmt.Sprintf("deployment replicas %d, want %d", got, want)
			}
			return ""
		}
	}
	eventually(t, "deployment with 1 replica", replicas(1))

	// kubectl scale goes through the scale subresource.
	if out, err := env.Kubectl("scale", "-n", egressNS, "egress/scaled", "--replicas=3"); err != nil {
		t.Fatalf("kubectl scale: %v: %s", err, out)
	}
	eventually(t, "deployment with 3 replicas", replicas(3))

	// So does a client such as an HPA; it reads the selector there too.
	scale := &autoscalingv1.Scale{}
	if err := c.SubResource("scale").Get(ctx, eg, scale); err != nil {
		t.Fatal(err)
	}
	if scale.Spec.Replicas != 3 {
		t.Errorf("scale spec.replicas %d, want 3", scale.Spec.Replicas)
	}
	eventually(t, "scale selector", func() string {
		if err := c.SubResource("scale").Get(ctx, eg, scale); err != nil {
			return err.Error()
		}
		if !strings.Contains(scale.Status.Selector, "egress.skein.dev/name=scaled") {
			return fmt.Sprintf("scale status.selector %q", scale.Status.Selector)
		}
		return ""
	})
	// The controller writes the Egress's status meanwhile, so an update
	// from a stale read may conflict: read again and retry, as an HPA does.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.SubResource("scale").Get(ctx, eg, scale); err != nil {
			return err
		}
		scale.Spec.Replicas = 0
		return c.SubResource("scale").Update(ctx, eg, client.WithSubResourceBody(scale))
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deployment with 0 replicas", replicas(0))
	if err := c.Get(ctx, client.ObjectKeyFromObject(eg), eg); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(eg.Spec.Replicas, -1); got != 0 {
		t.Errorf("egress spec.replicas %d after scaling to 0", got)
	}
}

func TestEgressTemplateRollsOut(t *testing.T) {
	_, c := startEgress(t, Options{})
	ctx := context.Background()
	eg := newEgress("tmpl", "198.51.100.0/24")
	eg.Spec.Template = &skeinv1.EgressPodTemplate{
		Metadata: skeinv1.EgressPodMetadata{Annotations: map[string]string{"example.com/a": "1"}},
	}
	eg.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	var first *appsv1.Deployment
	eventually(t, "deployment", func() string {
		var msg string
		if first, msg = getDeployment(t, c, "tmpl"); msg != "" {
			return msg
		}
		if first.Spec.Template.Annotations["example.com/a"] != "1" {
			return fmt.Sprintf("pod annotations %v", first.Spec.Template.Annotations)
		}
		return ""
	})
	if got := first.Spec.Template.Spec.Containers[0].Image; got != DefaultImage {
		t.Errorf("router image %q, want the default %q", got, DefaultImage)
	}
	svc := &corev1.Service{}
	eventually(t, "service timeout", func() string {
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "tmpl"}, svc); err != nil {
			return err.Error()
		}
		if cfg := svc.Spec.SessionAffinityConfig; cfg == nil || ptr.Deref(cfg.ClientIP.TimeoutSeconds, 0) != 600 {
			return fmt.Sprintf("affinity config %+v", cfg)
		}
		return ""
	})

	// Change the template: drop the annotation, override the router's
	// image and resources, add a sidecar, set a strategy. An image and a
	// sidecar of the Egress's choosing need its namespace's allowance.
	allowCustomPods(t, c, egressNS, "true")
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) {
		eg.Spec.Template = &skeinv1.EgressPodTemplate{
			Metadata: skeinv1.EgressPodMetadata{Labels: map[string]string{"team": "net"}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{
					{Name: "egress", Image: "registry.example/egress:v2", Env: []corev1.EnvVar{{Name: "X", Value: "y"}}},
					{Name: "sidecar", Image: "registry.example/sidecar:v1"},
				},
				NodeSelector: map[string]string{"egress": "true"},
			},
		}
		eg.Spec.Strategy = &appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
		eg.Spec.SessionAffinity = corev1.ServiceAffinityNone
	})
	eventually(t, "new template", func() string {
		dep, msg := getDeployment(t, c, "tmpl")
		if msg != "" {
			return msg
		}
		tp := dep.Spec.Template
		switch {
		case tp.Annotations["example.com/a"] != "":
			return fmt.Sprintf("removed annotation still there: %v", tp.Annotations)
		case tp.Labels["team"] != "net" || tp.Labels[skeinv1.LabelEgress] != "tmpl":
			return fmt.Sprintf("pod labels %v", tp.Labels)
		case len(tp.Spec.Containers) != 2:
			return fmt.Sprintf("containers %+v", tp.Spec.Containers)
		case tp.Spec.NodeSelector["egress"] != "true":
			return fmt.Sprintf("node selector %v", tp.Spec.NodeSelector)
		case dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType:
			return fmt.Sprintf("strategy %+v", dep.Spec.Strategy)
		}
		ctr := routerContainer(dep)
		if ctr.Image != "registry.example/egress:v2" || len(ctr.Env) == 0 || ctr.Env[0].Name != "X" || envFieldPath(ctr, "POD_IPS") != "status.podIPs" ||
			!slices.Equal(ctr.Command, []string{"skein-egress"}) || len(ctr.Ports) != 1 {
			return fmt.Sprintf("router container %+v: want the override merged over the defaults", *ctr)
		}
		if dep.Generation == first.Generation {
			return "generation unchanged"
		}
		return ""
	})
	eventually(t, "service affinity None", func() string {
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "tmpl"}, svc); err != nil {
			return err.Error()
		}
		if svc.Spec.SessionAffinity != corev1.ServiceAffinityNone || svc.Spec.SessionAffinityConfig != nil {
			return fmt.Sprintf("affinity %q %+v", svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig)
		}
		return ""
	})

	// A steady Egress writes nothing more.
	dep, _ := getDeployment(t, c, "tmpl")
	s := &corev1.Service{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "tmpl"}, s); err != nil {
		t.Fatal(err)
	}
	// A reconcile without a spec change (retried on a conflict: the
	// status of the last spec change may still be on its way).
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) { eg.Annotations = map[string]string{"poke": "1"} })
	for range 20 {
		d, _ := getDeployment(t, c, "tmpl")
		s2 := &corev1.Service{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "tmpl"}, s2); err != nil {
			t.Fatal(err)
		}
		if d.ResourceVersion != dep.ResourceVersion || s2.ResourceVersion != s.ResourceVersion {
			t.Fatalf("steady egress rewrote its objects: deployment %s -> %s, service %s -> %s",
				dep.ResourceVersion, d.ResourceVersion, s.ResourceVersion, s2.ResourceVersion)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A template the API server refuses leaves an event on the Egress.
func TestEgressBadTemplateEvent(t *testing.T) {
	_, c := startEgress(t, Options{})
	ctx := context.Background()
	// A sidecar needs the administrator's allowance: given, so that the
	// API server is the one to refuse the template.
	allowCustomPods(t, c, egressNS, "true")
	eg := newEgress("broken", "203.0.113.0/24")
	eg.Spec.Template = &skeinv1.EgressPodTemplate{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "sidecar"}}, // no image
	}}
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "event", func() string {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(egressNS)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Regarding.UID == eg.UID && e.Reason == ReasonEgressDeploymentFailed && e.Type == corev1.EventTypeWarning &&
				strings.Contains(e.Note, "image") {
				return ""
			}
		}
		return fmt.Sprintf("no DeploymentFailed event among %d", len(evs.Items))
	})
	if _, msg := getDeployment(t, c, "broken"); msg == "" {
		t.Error("a deployment was made from a refused template")
	}
}

// The CRD's schema refuses malformed destinations with a clear message.
func TestEgressSchema(t *testing.T) {
	env := kube.Start(t, kube.Options{})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egressNS}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		eg   *skeinv1.Egress
		want string
	}{
		{"not a cidr", newEgress("a", "192.0.2.1"), "must be a CIDR"},
		{"garbage", newEgress("b", "example.com/24"), "must be a CIDR"},
		{"host bits", newEgress("c", "192.0.2.1/24"), "host bits"},
		{"host bits v6", newEgress("d", "2001:db8::1/32"), "host bits"},
		{"duplicate", newEgress("e", "192.0.2.0/24", "10.0.0.0/8", "192.0.2.0/24"), "must not repeat"},
		{"none", newEgress("f"), "destinations"},
		{"negative replicas", func() *skeinv1.Egress {
			e := newEgress("g", "192.0.2.0/24")
			e.Spec.Replicas = ptr.To[int32](-1)
			return e
		}(), "replicas"},
		{"bad fou mode", func() *skeinv1.Egress {
			e := newEgress("h", "192.0.2.0/24")
			e.Spec.FoUSourcePort = "Random"
			return e
		}(), "fouSourcePort"},
	} {
		err := c.Create(ctx, tc.eg)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: create = %v, want Invalid mentioning %q", tc.name, err, tc.want)
		}
	}
	if err := c.Create(ctx, newEgress("ok", "192.0.2.0/24", "2001:db8::/32")); err != nil {
		t.Errorf("a good egress: %v", err)
	}
}

// TestEgressServiceDualStack: on a dual-stack cluster the Egress's
// Service has a ClusterIP of each family (IPv6 clients tunnel to the
// IPv6 one), and stays dual-stack: a Service turned single-stack behind
// the controller's back (an edit, or a Service of that name it adopted)
// is made dual-stack again, as its ports and selector are put back.
func TestEgressServiceDualStack(t *testing.T) {
	env := kube.Start(t, kube.Options{APIServerArgs: []string{
		"--allow-privileged=true", "--service-cluster-ip-range=10.0.0.0/24,fd00:10::/112",
	}})
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egressNS}}); err != nil {
		t.Fatal(err)
	}
	startAll(t, env, Options{})
	if err := c.Create(ctx, newEgress("nat", "0.0.0.0/0", "::/0")); err != nil {
		t.Fatal(err)
	}
	dualStack := func(what string) {
		t.Helper()
		eventually(t, what, func() string {
			svc := &corev1.Service{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "nat"}, svc); err != nil {
				return err.Error()
			}
			if len(svc.Spec.ClusterIPs) != 2 || len(svc.Spec.IPFamilies) != 2 {
				return fmt.Sprintf("policy %v, families %v, ClusterIPs %v; want one of each family",
					ptr.Deref(svc.Spec.IPFamilyPolicy, ""), svc.Spec.IPFamilies, svc.Spec.ClusterIPs)
			}
			return ""
		})
	}
	dualStack("a new Egress's Service")

	// Downgrade it as a user would (the API server releases the IPv6
	// ClusterIP), with a port changed too.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := &corev1.Service{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "nat"}, svc); err != nil {
			return err
		}
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
		svc.Spec.IPFamilies = svc.Spec.IPFamilies[:1]
		svc.Spec.ClusterIPs = svc.Spec.ClusterIPs[:1]
		svc.Spec.Ports[0].Port = 6000
		return c.Update(ctx, svc)
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the port put back", func() string {
		svc := &corev1.Service{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "nat"}, svc); err != nil {
			return err.Error()
		}
		if svc.Spec.Ports[0].Port != skeinv1.EgressFoUPort {
			return fmt.Sprintf("port %d", svc.Spec.Ports[0].Port)
		}
		return ""
	})
	dualStack("the Service after a single-stack edit")
}

// A strategy removed from the Egress is removed from its Deployment: the
// Deployment's default rolling update again, not the old parameters.
func TestEgressStrategyRemoved(t *testing.T) {
	_, c := startEgress(t, Options{})
	ctx := context.Background()
	eg := newEgress("strat", "192.0.2.0/24")
	zero, one := intstr.FromInt32(0), intstr.FromInt32(1)
	eg.Spec.Strategy = &appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &zero, MaxSurge: &one}}
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	strategy := func(wantUnavailable, wantSurge string) func() string {
		return func() string {
			dep, msg := getDeployment(t, c, "strat")
			if msg != "" {
				return msg
			}
			ru := dep.Spec.Strategy.RollingUpdate
			if dep.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
				ru.MaxUnavailable.String() != wantUnavailable || ru.MaxSurge.String() != wantSurge {
				return fmt.Sprintf("strategy %s %+v, want RollingUpdate maxUnavailable %s maxSurge %s", dep.Spec.Strategy.Type, ru, wantUnavailable, wantSurge)
			}
			return ""
		}
	}
	eventually(t, "the Egress's strategy", strategy("0", "1"))
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) { eg.Spec.Strategy = nil })
	eventually(t, "the default strategy", strategy("25%", "25%"))

	// And it stays put: a reconcile writes nothing.
	dep, _ := getDeployment(t, c, "strat")
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) { eg.Annotations = map[string]string{"poke": "1"} })
	for range 20 {
		if d, _ := getDeployment(t, c, "strat"); d.ResourceVersion != dep.ResourceVersion {
			t.Fatalf("steady egress rewrote its deployment: %s -> %s", dep.ResourceVersion, d.ResourceVersion)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEgressDeletedRemovesOwned deletes Egresses, as a client and with
// kubectl, both with the default background propagation, against the
// real garbage collector: each Egress's Deployment and Service go with it
// (the collector follows their controller owner references), and with
// the namespace's last Egress its ServiceAccount and its subject in the
// ClusterRoleBinding go too.
func TestEgressDeletedRemovesOwned(t *testing.T) {
	env := kube.Start(t, kube.Options{APIServerArgs: []string{"--allow-privileged=true"}})
	// Started before the namespace and the controller, once the CRDs are
	// served: the collector then watches Egresses from the start.
	env.StartGarbageCollector(t)
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egressNS}}); err != nil {
		t.Fatal(err)
	}
	startAll(t, env, Options{})

	first, second := newEgress("first", "192.0.2.0/24"), newEgress("second", "0.0.0.0/0")
	for _, eg := range []*skeinv1.Egress{first, second} {
		if err := c.Create(ctx, eg); err != nil {
			t.Fatal(err)
		}
	}
	// made reports what of eg's Deployment and Service is missing or not
	// owned by it.
	made := func(eg *skeinv1.Egress) func() string {
		return func() string {
			dep, msg := getDeployment(t, c, eg.Name)
			if msg != "" {
				return msg
			}
			if msg := ownedBy(dep, eg); msg != "" {
				return msg
			}
			svc := &corev1.Service{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: eg.Name}, svc); err != nil {
				return err.Error()
			}
			return ownedBy(svc, eg)
		}
	}
	// gone reports which of eg's Deployment and Service still exist.
	gone := func(eg *skeinv1.Egress) func() string {
		return func() string {
			for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}} {
				err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: eg.Name}, o)
				if !apierrors.IsNotFound(err) {
					return fmt.Sprintf("%T %s still there (get: %v)", o, eg.Name, err)
				}
			}
			return ""
		}
	}
	// access reports how the namespace's account, its pod RoleBindings
	// and its Egress Role differ from the owners (Egress names) and the
	// namespaces wanted.
	access := func(owners, namespaces []string) func() string {
		return func() string {
			sa, err := getSA(c, egressNS)
			switch {
			case owners == nil && !apierrors.IsNotFound(err):
				return fmt.Sprintf("ServiceAccount %s still there (get: %v)", EgressServiceAccount, err)
			case owners != nil && err != nil:
				return err.Error()
			case owners != nil && !slices.Equal(ownerNames(sa), owners):
				return fmt.Sprintf("ServiceAccount owners %q, want %q", ownerNames(sa), owners)
			}
			ns, msg := podBindingNamespaces(c)
			if msg != "" {
				return msg
			}
			if !slices.Equal(ns, namespaces) {
				return fmt.Sprintf("pod RoleBindings of the accounts of %q, want %q", ns, namespaces)
			}
			role := &rbacv1.Role{}
			err = c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: EgressRBACName}, role)
			switch {
			case owners == nil && !apierrors.IsNotFound(err):
				return fmt.Sprintf("Role %s still there (get: %v)", EgressRBACName, err)
			case owners != nil && err != nil:
				return err.Error()
			case owners != nil && (len(role.Rules) != 1 || !slices.Equal(role.Rules[0].ResourceNames, owners)):
				return fmt.Sprintf("Role rules %+v, want egresses %q by name", role.Rules, owners)
			}
			return ""
		}
	}
	eventually(t, "first made", made(first))
	eventually(t, "second made", made(second))
	eventually(t, "account of both", access([]string{"first", "second"}, []string{egressNS}))

	// As a client, background propagation stated as kubectl does.
	if err := c.Delete(ctx, first, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete Egress first: %v", err)
	}
	eventually(t, "first's Deployment and Service collected", gone(first))
	eventually(t, "account of second only", access([]string{"second"}, []string{egressNS}))
	if msg := made(second)(); msg != "" {
		t.Errorf("second's objects after first was deleted: %s", msg)
	}

	// With kubectl, the namespace's last Egress.
	if out, err := env.Kubectl("delete", "egress", "-n", egressNS, second.Name); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(string(out), "deleted") {
		t.Errorf("kubectl delete egress said %q", out)
	}
	eventually(t, "second's Deployment and Service collected", gone(second))
	eventually(t, "no account, no subject", access(nil, nil))
}

// allowCustomPods sets (or, with "", removes) the namespace's
// AnnotationAllowCustomEgressPods, as an administrator does.
func allowCustomPods(t *testing.T, c client.Client, namespace, value string) {
	t.Helper()
	var ns corev1.Namespace
	if err := c.Get(context.Background(), client.ObjectKey{Name: namespace}, &ns); err != nil {
		t.Fatal(err)
	}
	if ns.Annotations == nil {
		ns.Annotations = map[string]string{}
	}
	if value == "" {
		delete(ns.Annotations, AnnotationAllowCustomEgressPods)
	} else {
		ns.Annotations[AnnotationAllowCustomEgressPods] = value
	}
	if err := c.Update(context.Background(), &ns); err != nil {
		t.Fatal(err)
	}
}

func TestTemplateViolations(t *testing.T) {
	const img = "skein:dev"
	cases := []struct {
		name string
		spec corev1.PodSpec
		bad  bool
	}{
		{"empty", corev1.PodSpec{}, false},
		{"node selector, tolerations, resources of the router", corev1.PodSpec{
			NodeSelector: map[string]string{"egress": "true"},
			Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:   []corev1.Container{{Name: "egress", Image: img, Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}},
		}, false},
		{"the controller's account spelled out", corev1.PodSpec{ServiceAccountName: EgressServiceAccount}, false},
		{"a user namespace", corev1.PodSpec{HostUsers: ptr.To(false)}, false},
		{"hostNetwork", corev1.PodSpec{HostNetwork: true}, true},
		{"hostPID", corev1.PodSpec{HostPID: true}, true},
		{"hostIPC", corev1.PodSpec{HostIPC: true}, true},
		{"hostUsers", corev1.PodSpec{HostUsers: ptr.To(true)}, true},
		{"hostPath", corev1.PodSpec{Volumes: []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}}, true},
		{"another account", corev1.PodSpec{ServiceAccountName: "admin"}, true},
		{"another account, old field", corev1.PodSpec{DeprecatedServiceAccount: "admin"}, true},
		{"a sidecar", corev1.PodSpec{Containers: []corev1.Container{{Name: "sidecar", Image: img}}}, true},
		{"an init container", corev1.PodSpec{InitContainers: []corev1.Container{{Name: "init", Image: img}}}, true},
		{"another image", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", Image: "evil/egress:1"}}}, true},
		{"privileged router", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}}, true},
		{"a command of its own", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", Command: []string{"sh"}}}}, true},
		{"pod securityContext", corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}}, true},
		// What the router container is made privileged with must not run
		// the tenant's programs: hooks, exec probes, volumes bringing
		// them, arguments of its own. A review found each accepted.
		{"postStart exec", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", Lifecycle: &corev1.Lifecycle{
			PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/tools/payload"}}}}}}}, true},
		{"liveness exec probe", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", LivenessProbe: execProbe}}}, true},
		{"readiness exec probe", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", ReadinessProbe: execProbe}}}, true},
		{"startup exec probe", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", StartupProbe: execProbe}}}, true},
		{"image volume mounted in the router", corev1.PodSpec{
			Volumes:    []corev1.Volume{{Name: "tools", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "tenant.example/tools:1"}}}},
			Containers: []corev1.Container{{Name: "egress", VolumeMounts: []corev1.VolumeMount{{Name: "tools", MountPath: "/tools"}}}}}, true},
		{"configMap volume", corev1.PodSpec{Volumes: []corev1.Volume{{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}}}}, true},
		{"hostPort", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress",
			Ports: []corev1.ContainerPort{{ContainerPort: 22, HostPort: 22, Protocol: corev1.ProtocolTCP}}}}}, true},
		{"arguments of its own (another Egress)", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress",
			Args: []string{"--egress-name", "theirs", "--egress-namespace", "other-team"}}}}, true},
		{"the controller's variables", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress",
			Env: []corev1.EnvVar{{Name: "POD_NAMESPACE", Value: "other-team"}}}}}, true},
		{"envFrom", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", EnvFrom: []corev1.EnvFromSource{{Prefix: "X"}}}}}, true},
		{"a terminal", corev1.PodSpec{Containers: []corev1.Container{{Name: "egress", TTY: true, Stdin: true}}}, true},
		{"nodeName past the scheduler", corev1.PodSpec{NodeName: "control-plane"}, true},
		{"a runtime class", corev1.PodSpec{RuntimeClassName: ptr.To("unconfined")}, true},
		{"shared process namespace", corev1.PodSpec{ShareProcessNamespace: ptr.To(true)}, true},
		{"another scheduler", corev1.PodSpec{SchedulerName: "mine"}, true},
		{"where it runs and how it is pulled", corev1.PodSpec{
			Affinity:                      &corev1.Affinity{},
			TopologySpreadConstraints:     []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "zone"}},
			PriorityClassName:             "high",
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			DNSPolicy:                     corev1.DNSDefault,
			ImagePullSecrets:              []corev1.LocalObjectReference{{Name: "pull"}},
			Containers: []corev1.Container{{Name: "egress", ImagePullPolicy: corev1.PullAlways,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
		}, false},
	}
	for _, tc := range cases {
		eg := newEgress("x", "198.51.100.0/24")
		eg.Spec.Template = &skeinv1.EgressPodTemplate{Spec: tc.spec}
		if v := templateViolations(eg, img); (len(v) > 0) != tc.bad {
			t.Errorf("%s: violations %v, want refused=%v", tc.name, v, tc.bad)
		}
	}
	for ann, bad := range map[string]bool{
		"prometheus.io/scrape": false, "team": false, "example.com/owner": false,
		"skein.dev/networks": true, "egress.skein.dev/x": true, "container.apparmor.security.beta.kubernetes.io/egress": true,
		"kubernetes.io/ingress-bandwidth": true,
	} {
		eg := newEgress("x", "198.51.100.0/24")
		eg.Spec.Template = &skeinv1.EgressPodTemplate{Metadata: skeinv1.EgressPodMetadata{Annotations: map[string]string{ann: "1"}}}
		if v := templateViolations(eg, img); (len(v) > 0) != bad {
			t.Errorf("annotation %s: violations %v, want refused=%v", ann, v, bad)
		}
	}
}

var execProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/tools/payload"}}}}

// TestEgressTemplatePolicy: an Egress author cannot get through the
// controller what they could not create themselves. A template with a
// hostPath and hostNetwork in a namespace without the administrator's
// allowance gets no Deployment (a TemplateRefused event says why); the
// allowance, given later, lets it run; taken away, the routers stay as
// they are while a new refused change is not applied.
func TestEgressTemplatePolicy(t *testing.T) {
	_, c := startEgress(t, Options{})
	ctx := context.Background()
	eg := newEgress("rooted", "198.51.100.0/24")
	eg.Spec.Template = &skeinv1.EgressPodTemplate{Spec: corev1.PodSpec{
		HostNetwork: true,
		Volumes:     []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}},
	}}
	if err := c.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a TemplateRefused event", func() string {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(egressNS)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == ReasonEgressTemplateRefused && e.Regarding.Name == "rooted" &&
				strings.Contains(e.Note, "hostPath volume \"root\"") && strings.Contains(e.Note, AnnotationAllowCustomEgressPods) {
				return ""
			}
		}
		return fmt.Sprintf("%d events, none TemplateRefused for rooted", len(evs.Items))
	})
	var dep appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "rooted"}, &dep); !apierrors.IsNotFound(err) {
		t.Fatalf("a Deployment of the refused template: %v %+v", err, dep.Spec.Template.Spec)
	}
	// The Service is the clients' and needs no router pods: it is there.
	var svc corev1.Service
	eventually(t, "the Service", func() string {
		if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: "rooted"}, &svc); err != nil {
			return err.Error()
		}
		return ""
	})

	allowCustomPods(t, c, egressNS, "true")
	eventually(t, "the Deployment once allowed", func() string {
		d, msg := getDeployment(t, c, "rooted")
		if msg != "" {
			return msg
		}
		if !d.Spec.Template.Spec.HostNetwork {
			return "hostNetwork not applied"
		}
		return ""
	})

	// Allowance taken away: a new change asking for more is refused (its
	// event names it) and not applied; the routers stay as they were.
	allowCustomPods(t, c, egressNS, "")
	updateEgress(t, c, eg, func(eg *skeinv1.Egress) {
		eg.Spec.Template.Spec.Containers = []corev1.Container{{Name: "sneaky", Image: "evil/tool:1"}}
	})
	eventually(t, "the sidecar refused", func() string {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(egressNS)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == ReasonEgressTemplateRefused && strings.Contains(e.Note, `container "sneaky"`) {
				return ""
			}
		}
		return "no TemplateRefused event naming the sidecar"
	})
	d, msg := getDeployment(t, c, "rooted")
	if msg != "" {
		t.Fatal(msg)
	}
	for _, ct := range d.Spec.Template.Spec.Containers {
		if ct.Name == "sneaky" {
			t.Errorf("the refused sidecar is in the Deployment")
		}
	}
}

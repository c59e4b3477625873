// Package deploy checks deploy/kubernetes against a real kube-apiserver
// (test/kube): the kustomize base applies (server-side dry run, then for
// real), its objects read back as meant, and each component's RBAC grants
// what it needs and nothing asked for beyond (kubectl auth can-i, as the
// component's service account). No kubelet runs here, so no pod starts:
// the Deployment and DaemonSet are checked as objects, not as processes.
package deploy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/skeinnet/skein/test/kube"
)

const (
	namespace = "skein-system"
	image     = "skein:dev"
	// The names internal/webhook uses by default.
	webhookService = "skein-controller-webhook"
	webhookConfig  = "skein-addresspool-validation"
)

func base(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestApply(t *testing.T) {
	// skeind is privileged: a cluster that runs any CNI daemon allows
	// that (kubeadm's API server is started so); test/kube's does not by
	// default.
	env := kube.Start(t, kube.Options{APIServerArgs: []string{"--allow-privileged=true"}})
	dir := base(t)

	// A server-side dry run of the namespaced objects needs their
	// namespace to exist; everything else is checked without it.
	if _, err := env.Kubectl("apply", "-f", filepath.Join(dir, "namespace.yaml")); err != nil {
		t.Fatal(err)
	}
	out, err := env.Kubectl("apply", "-k", dir, "--dry-run=server")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dry run:\n%s", out)
	if out, err = env.Kubectl("apply", "-k", dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("apply:\n%s", out)
	// Applying again changes nothing and fails nothing.
	if out, err = env.Kubectl("apply", "-k", dir); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), " configured") || strings.Contains(string(out), " created") {
		t.Errorf("second apply changed objects:\n%s", out)
	}

	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Run("controller", func(t *testing.T) { checkController(ctx, t, c) })
	t.Run("skeind", func(t *testing.T) { checkSkeind(ctx, t, c) })
	t.Run("rbac", func(t *testing.T) { checkRBAC(t, env) })
	t.Run("identity policy", func(t *testing.T) { checkIdentityPolicy(ctx, t, c) })
	t.Run("egress", func(t *testing.T) { checkEgressRBAC(t, env) })
}

// checkEgressRBAC: the controller, with the base's permissions, can
// grant a namespace's router account what skein-controller grants it (a
// Role reading that namespace's Egresses by name, a RoleBinding to the
// router ClusterRole in a served namespace), and nothing more (RBAC's
// escalation check stands behind the creates it cannot narrow); the
// router account then reads what skein-egress watches, not more.
func checkEgressRBAC(t *testing.T, env *kube.Env) {
	const (
		controller = "system:serviceaccount:" + namespace + ":skein-controller"
		router     = "system:serviceaccount:default:skein-egress"
	)
	if out, err := env.Kubectl("create", "serviceaccount", "skein-egress", "-n", "default", "--as", controller); err != nil {
		t.Fatalf("the controller cannot make a router account: %v: %s", err, out)
	}
	if out, err := env.Kubectl("create", "role", "skein-egress", "-n", "default", "--verb=get,list,watch",
		"--resource=egresses.skein.dev", "--resource-name=nat", "--as", controller); err != nil {
		t.Fatalf("the controller cannot make the router account's Egress Role: %v: %s", err, out)
	}
	if out, err := env.Kubectl("create", "rolebinding", "skein-egress", "-n", "default", "--role=skein-egress",
		"--serviceaccount=default:skein-egress", "--as", controller); err != nil {
		t.Fatalf("the controller cannot bind the Egress Role: %v: %s", err, out)
	}
	if out, err := env.Kubectl("create", "rolebinding", "skein-egress-default", "-n", "kube-system", "--clusterrole=skein-egress",
		"--serviceaccount=default:skein-egress", "--as", controller); err != nil {
		t.Fatalf("the controller cannot bind the router ClusterRole in a served namespace: %v: %s", err, out)
	}
	if out, err := env.Kubectl("create", "rolebinding", "skein-test-escalation", "-n", "default", "--clusterrole=cluster-admin",
		"--serviceaccount=default:skein-egress", "--as", controller); err == nil || !strings.Contains(string(out), "forbidden") {
		t.Errorf("the controller binding cluster-admin: %v: %s; want forbidden", err, out)
	}
	if out, err := env.Kubectl("create", "role", "skein-test-escalation", "-n", "default", "--verb=get",
		"--resource=secrets", "--as", controller); err == nil || !strings.Contains(string(out), "forbidden") {
		t.Errorf("the controller making a Role that reads secrets: %v: %s; want forbidden", err, out)
	}
	for _, r := range []access{
		{"watch", "pods", "", "", false},
		{"list", "pods", "", "default", false},
		{"get", "egresses.skein.dev/nat", "", "default", true},
		{"get", "egresses.skein.dev/other", "", "default", false},
		{"list", "egresses.skein.dev", "", "", false},
		{"get", "pods", "", "kube-system", true},
		{"watch", "pods", "", "kube-system", true},
		{"update", "pods", "", "default", false},
		{"update", "egresses.skein.dev", "status", "default", false},
		{"get", "secrets", "", "default", false},
		{"list", "services", "", "", false},
	} {
		args := []string{"auth", "can-i", r.verb, r.resource, "--as", router}
		if r.sub != "" {
			args = append(args, "--subresource", r.sub)
		}
		if r.ns == "" {
			args = append(args, "--all-namespaces")
		} else {
			args = append(args, "--namespace", r.ns)
		}
		out, _ := env.Kubectl(args...)
		if got := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]) == "yes"; got != r.allowed {
			t.Errorf("skein-egress: can %s %s (subresource %q, namespace %q) = %v, want %v", r.verb, r.resource, r.sub, r.ns, got, r.allowed)
		}
	}
}

func checkController(ctx context.Context, t *testing.T, c client.Client) {
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "skein-controller"}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != "skein-controller" {
		t.Errorf("service account %q, want skein-controller", pod.ServiceAccountName)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	checkImage(t, ctr)
	if !slices.Contains(ctr.Args, "--leader-elect") {
		t.Errorf("args %q lack --leader-elect", ctr.Args)
	}
	if ctr.LivenessProbe == nil || ctr.ReadinessProbe == nil {
		t.Error("controller has no liveness or readiness probe")
	}
	if sc := ctr.SecurityContext; sc == nil || sc.Privileged != nil && *sc.Privileged ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("controller's security context %+v: want unprivileged, read-only root", sc)
	}

	// The webhook Service reaches the controller's webhook port.
	checkService(ctx, t, c, webhookService, 443, d)

	// A webhook configuration in the base (deploy/kubernetes/webhook, once
	// listed) must call a Service of the base that reaches the controller.
	var vwcs admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := c.List(ctx, &vwcs, client.MatchingLabels{"app.kubernetes.io/part-of": "skein"}); err != nil {
		t.Fatal(err)
	}
	if len(vwcs.Items) == 0 {
		t.Logf("no ValidatingWebhookConfiguration in the base (deploy/kubernetes/webhook not listed)")
	}
	for _, cfg := range vwcs.Items {
		if cfg.Name != webhookConfig {
			t.Errorf("ValidatingWebhookConfiguration %s: the controller may only write %s", cfg.Name, webhookConfig)
		}
		for _, w := range cfg.Webhooks {
			s := w.ClientConfig.Service
			if s == nil || s.Namespace != namespace {
				t.Errorf("webhook %s does not call a Service in %s: %+v", w.Name, namespace, w.ClientConfig)
				continue
			}
			port := int32(443)
			if s.Port != nil {
				port = *s.Port
			}
			checkService(ctx, t, c, s.Name, port, d)
		}
	}
}

// checkService checks that Service name selects d's pods and sends port
// to a port of its container.
func checkService(ctx context.Context, t *testing.T, c client.Client, name string, port int32, d appsv1.Deployment) {
	t.Helper()
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &svc); err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Selector) == 0 {
		t.Errorf("Service %s selects nothing", name)
	}
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service %s selects %s=%s, the controller's pods are labelled %v", name, k, v, d.Spec.Template.Labels)
		}
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port })
	if i < 0 {
		t.Fatalf("Service %s has no port %d: %+v", name, port, svc.Spec.Ports)
	}
	target := svc.Spec.Ports[i].TargetPort
	ctr := d.Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool {
		return target.Type == intstr.String && p.Name == target.StrVal || target.Type == intstr.Int && p.ContainerPort == target.IntVal
	}) {
		t.Errorf("Service %s sends port %d to %s, the controller has %+v", name, port, target.String(), ctr.Ports)
	}
}

func checkSkeind(ctx context.Context, t *testing.T, c client.Client) {
	var ds appsv1.DaemonSet
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "skeind"}, &ds); err != nil {
		t.Fatal(err)
	}
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork || pod.HostPID {
		t.Errorf("hostNetwork %v, hostPID %v: want the host's network, not its PIDs", pod.HostNetwork, pod.HostPID)
	}
	if pod.ServiceAccountName != "skeind" {
		t.Errorf("service account %q, want skeind", pod.ServiceAccountName)
	}
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 1 {
		t.Fatalf("%d containers and %d init containers, want 1 and 1", len(pod.Containers), len(pod.InitContainers))
	}
	ctr := pod.Containers[0]
	checkImage(t, ctr)
	for _, a := range []string{"--store=kubernetes", "--node=$(NODE_NAME)"} {
		if !slices.Contains(ctr.Args, a) {
			t.Errorf("skeind's args %q lack %s", ctr.Args, a)
		}
	}
	if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
			e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("skeind's NODE_NAME does not come from spec.nodeName: %+v", ctr.Env)
	}
	if sc := ctr.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("skeind is not privileged")
	}
	hostPaths := map[string]string{} // volume name -> host path
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := func(ctr corev1.Container) map[string]corev1.VolumeMount { // host path -> mount
		m := map[string]corev1.VolumeMount{}
		for _, vm := range ctr.VolumeMounts {
			if p, ok := hostPaths[vm.Name]; ok {
				m[p] = vm
			}
		}
		return m
	}
	m := mounts(ctr)
	for _, p := range []string{"/run/skein", "/var/lib/skein", "/run/netns"} {
		if vm, ok := m[p]; !ok || vm.MountPath != p || vm.ReadOnly {
			t.Errorf("skeind does not mount the host's %s read-write at the same path: %+v", p, vm)
		}
	}
	if vm := m["/run/netns"]; vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("/run/netns propagation %v, want Bidirectional", vm.MountPropagation)
	}

	// The init container installs the plugins and the conflist onto the host.
	initc := pod.InitContainers[0]
	checkImage(t, initc)
	m = mounts(initc)
	for _, p := range []string{"/opt/cni/bin", "/etc/cni/net.d"} {
		vm, ok := m[p]
		if !ok || vm.ReadOnly {
			t.Errorf("the init container does not mount the host's %s writable", p)
			continue
		}
		flag := map[string]string{"/opt/cni/bin": "--bin-dir=", "/etc/cni/net.d": "--conf-dir="}[p]
		if !slices.Contains(initc.Args, flag+vm.MountPath) {
			t.Errorf("the init container mounts %s at %s but its args are %q", p, vm.MountPath, initc.Args)
		}
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "skein-cni"}, &cm); err != nil {
		t.Fatal(err)
	}
	var conflist struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(cm.Data["10-skein.conflist"]), &conflist); err != nil {
		t.Fatalf("the conflist is not JSON: %v", err)
	}
	if conflist.CNIVersion == "" || conflist.Name == "" || len(conflist.Plugins) == 0 || conflist.Plugins[0]["type"] != "skein" {
		t.Errorf("conflist %+v: want a version, a name and the skein plugin first", conflist)
	}
	if !slices.Contains(initc.Args, "--conf=/etc/skein/cni/10-skein.conflist") {
		t.Errorf("the init container does not install the conflist: %q", initc.Args)
	}
}

// checkImage checks that ctr runs skein's image and one of the binaries
// the Dockerfile (and hack/mkimage, which a test keeps in step) puts in it.
func checkImage(t *testing.T, ctr corev1.Container) {
	t.Helper()
	if ctr.Image != image {
		t.Errorf("container %s runs %q, want %q", ctr.Name, ctr.Image, image)
	}
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var inImage []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "COPY" {
			for _, src := range f[1 : len(f)-1] {
				inImage = append(inImage, filepath.Join(f[len(f)-1], filepath.Base(src)))
			}
		}
	}
	if len(ctr.Command) == 0 || !slices.Contains(inImage, ctr.Command[0]) {
		t.Errorf("container %s runs %q; the image holds %q", ctr.Name, ctr.Command, inImage)
	}
}

// A rule of the RBAC table: can the component do verb on resource
// (kubectl auth can-i syntax: "resource[.group][/name]") in namespace ns
// ("" for cluster-scoped, or any namespace).
type access struct {
	verb, resource, sub, ns string
	allowed                 bool
}

func checkRBAC(t *testing.T, env *kube.Env) {
	const (
		pools    = "addresspools.skein.dev"
		blocks   = "addressblocks.skein.dev"
		requests = "blockrequests.skein.dev"
		vwc      = "validatingwebhookconfigurations.admissionregistration.k8s.io"
		leases   = "leases.coordination.k8s.io"
		egresses = "egresses.skein.dev"
		deploys  = "deployments.apps"
		crbs     = "clusterrolebindings.rbac.authorization.k8s.io"
		croles   = "clusterroles.rbac.authorization.k8s.io"
		roles    = "roles.rbac.authorization.k8s.io"
		rbs      = "rolebindings.rbac.authorization.k8s.io"
	)
	table := map[string][]access{
		"skein-controller": {
			// An Egress's namespace's allow-custom-pods annotation.
			{"watch", "namespaces", "", "", true},
			{"update", "namespaces", "", "", false},
			{"get", pools, "", "", true},
			{"watch", pools, "", "", true},
			{"update", pools, "", "", true}, // the pool's finalizer
			{"update", pools, "status", "", true},
			{"create", pools, "", "", false},
			{"delete", pools, "", "", false},
			// Nodes claim their own blocks: the controller only takes
			// back those of nodes gone for good, and old requests.
			{"create", blocks, "", "", false},
			{"update", blocks, "", "", false},
			{"delete", blocks, "", "", true},
			{"patch", blocks, "", "", true},
			{"list", requests, "", "", true},
			{"delete", requests, "", "", true},
			{"update", requests, "status", "", false},
			{"create", requests, "", "", false},
			{"list", "nodes", "", "", true},
			{"update", "nodes", "", "", false},
			{"delete", "nodes", "", "", false},
			{"create", "events", "", "default", true},
			{"create", leases, "", namespace, true},
			{"update", leases, "", namespace, true},
			{"delete", leases, "", namespace, true}, // a collected node's liveness Lease
			{"create", leases, "", "kube-system", false},
			{"get", "secrets/skein-webhook-cert", "", namespace, true},
			{"update", "secrets/skein-webhook-cert", "", namespace, true},
			{"create", "secrets", "", namespace, true},
			{"get", "secrets/another", "", namespace, false},
			{"list", "secrets", "", namespace, false},
			{"get", "secrets/skein-webhook-cert", "", "kube-system", false},
			{"create", "secrets", "", "kube-system", false},
			{"get", vwc + "/" + webhookConfig, "", "", true},
			{"update", vwc + "/" + webhookConfig, "", "", true},
			{"patch", vwc + "/someone-elses", "", "", false},
			{"create", vwc, "", "", false},
			{"list", vwc, "", "", false},
			{"list", "pods", "", "", false},
			{"create", "pods", "", namespace, false},
			// Egresses: read, status written, run as Deployments and
			// Services in any namespace; not made or changed by it.
			{"watch", egresses, "", "", true},
			{"update", egresses, "status", "", true},
			{"update", egresses, "finalizers", "", true},
			{"create", egresses, "", "", false},
			{"update", egresses, "", "", false},
			{"delete", egresses, "", "", false},
			{"update", egresses, "scale", "", false},
			{"watch", deploys, "", "", true},
			{"create", deploys, "", "default", true},
			{"update", deploys, "", "default", true},
			{"delete", deploys, "", "default", true},
			{"create", "services", "", "default", true},
			{"update", "services", "", "default", true},
			{"delete", "services", "", "default", true},
			{"list", "services", "", "", true},
			{"update", "statefulsets.apps", "", "default", false},
			// Egress router pods' account and its binding, by name.
			{"create", "serviceaccounts", "", "default", true},
			{"get", "serviceaccounts/skein-egress", "", "default", true},
			{"delete", "serviceaccounts/skein-egress", "", "default", true},
			{"delete", "serviceaccounts/default", "", "default", false},
			{"list", "serviceaccounts", "", "", false},
			{"create", "serviceaccounts", "token", "default", false},
			{"create", crbs, "", "", true},
			{"update", crbs + "/skein-egress", "", "", true},
			{"update", crbs + "/skein-controller", "", "", false},
			{"list", crbs, "", "", false},
			{"bind", croles + "/skein-egress", "", "", true},
			{"bind", croles + "/cluster-admin", "", "", false},
			{"update", croles + "/skein-egress", "", "", false},
			// The router accounts' Egress Role (by name) and their
			// RoleBindings (names vary: skein-egress-<namespace>).
			{"create", roles, "", "default", true},
			{"update", roles + "/skein-egress", "", "default", true},
			{"delete", roles + "/skein-egress", "", "default", true},
			{"update", roles + "/skein-controller", "", namespace, false},
			{"list", roles, "", "", false},
			{"create", rbs, "", "default", true},
			{"list", rbs, "", "", true},
			{"delete", rbs, "", "default", true},
		},
		"skeind": {
			{"list", pools, "", "", true},
			{"watch", pools, "", "", true},
			{"create", pools, "", "", false},
			{"update", pools, "", "", false},
			{"delete", pools, "", "", false},
			{"update", pools, "status", "", false},
			{"watch", "namespaces", "", "", true},
			{"update", "namespaces", "", "", false},
			{"get", "nodes", "", "", true},
			{"update", "nodes", "", "", false},
			// Routing between nodes: every Node's addresses, its own
			// annotation (a patch), not the Node's status.
			{"list", "nodes", "", "", true},
			{"watch", "nodes", "", "", true},
			{"patch", "nodes", "", "", true},
			{"patch", "nodes", "status", "", false},
			{"delete", "nodes", "", "", false},
			{"watch", blocks, "", "", true},
			{"patch", "events", "", "default", true},
			// BlockRequests are retired: skeind has no use for them.
			{"create", requests, "", "", false},
			{"delete", requests, "", "", false},
			{"watch", requests, "", "", false},
			{"list", requests, "", "", false},
			{"update", requests, "", "", false},
			{"update", requests, "status", "", false},
			// Its blocks: claimed, adopted, freed (delete, then the
			// finalizer). RBAC cannot narrow these to the node's own
			// blocks; skeind-policy.yaml does (test/identity).
			{"list", blocks, "", "", true},
			{"create", blocks, "", "", true},
			{"update", blocks, "", "", true},
			{"patch", blocks, "", "", true},
			{"delete", blocks, "", "", true},
			{"deletecollection", blocks, "", "", false},
			{"update", blocks, "status", "", false},
			{"create", "events", "", "default", true},
			{"get", "secrets", "", namespace, false},
			// Its liveness Lease, in skein's namespace only.
			{"get", leases, "", namespace, true},
			{"create", leases, "", namespace, true},
			{"update", leases, "", namespace, true},
			{"delete", leases, "", namespace, true},
			{"list", leases, "", namespace, false},
			{"patch", leases, "", namespace, false},
			{"create", leases, "", "kube-system", false},
			{"update", leases, "", "default", false},
			// Egress clients: pods, Services and Egresses read, never
			// written.
			{"list", "pods", "", "", true},
			{"watch", "pods", "", "", true},
			{"get", "pods", "", "default", true},
			{"update", "pods", "", "default", false},
			{"delete", "pods", "", "default", false},
			{"watch", "services", "", "", true},
			{"get", "services", "", "default", true},
			{"update", "services", "", "default", false},
			{"get", egresses, "", "default", true},
			{"list", egresses, "", "", true},
			{"watch", egresses, "", "", true},
			{"update", egresses, "", "", false},
			{"create", "events", "", "kube-system", true},
			{"patch", vwc + "/" + webhookConfig, "", "", false},
			{"update", egresses, "status", "", false},
			{"create", deploys, "", "default", false},
		},
	}
	for sa, rules := range table {
		as := "system:serviceaccount:" + namespace + ":" + sa
		for _, r := range rules {
			args := []string{"auth", "can-i", r.verb, r.resource, "--as", as}
			if r.sub != "" {
				args = append(args, "--subresource", r.sub)
			}
			if r.ns == "" {
				args = append(args, "--all-namespaces")
			} else {
				args = append(args, "--namespace", r.ns)
			}
			// can-i answers "yes" (exit 0) or "no" (exit 1).
			out, err := env.Kubectl(args...)
			answer := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
			if answer != "yes" && answer != "no" {
				t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
			}
			if got := answer == "yes"; got != r.allowed {
				t.Errorf("%s: can %s %s (subresource %q, namespace %q) = %v, want %v", sa, r.verb, r.resource, r.sub, r.ns, got, r.allowed)
			}
		}
	}
}

func TestImageOverride(t *testing.T) {
	kubectl := filepath.Join(kube.AssetsDir(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Skipf("no kubectl in %s: run make deps", kube.AssetsDir())
	}
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base(t)) // kustomize takes no absolute paths
	if err != nil {
		t.Fatal(err)
	}
	kust := "resources:\n- " + rel + "\nimages:\n- name: skein\n  newName: registry.example/skein\n  newTag: v9\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := kubectlOutput(kubectl, "kustomize", "--load-restrictor=LoadRestrictionsNone", overlay)
	if err != nil {
		t.Fatal(err)
	}
	images := 0
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "image: "); ok {
			images++
			if v != "registry.example/skein:v9" {
				t.Errorf("an overlay's images: entry left %q", v)
			}
		}
	}
	if images != 3 {
		t.Errorf("found %d images in the overlay's output, want 3 (controller, skeind, its init container)", images)
	}
}

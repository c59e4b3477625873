package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/egress"
	"github.com/skeinnet/skein/test/guest"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// routerMetricsPort is where skein-egress serves /metrics in its pod.
const routerMetricsPort = 9386

// cluster is what the inner test works with: the API, the node's skeind,
// the Egress gateways.
type cluster struct {
	c          client.Client
	kubeconfig string
	node       *kubenode.Node
	nat, auto  *gateway
	// routers by pod name.
	routers map[string]*router
}

// gateway is an Egress as the node sees it: its Service's ClusterIPs and
// selector, its router pods' labels, and the routers the emulated
// kube-proxy sends the Service to.
type gateway struct {
	name       string
	cip4, cip6 netip.Addr
	selector   map[string]string
	labels     map[string]string
	endpoints  []*router
}

// TestEgressClusterInside: the guest half of TestEgressCluster (see
// there). The guest's root namespace is the node guest-node: skeind runs
// there in the Kubernetes mode; pods are namespaces ADDed through the
// skein CNI plugin, their Pod objects made and their status written by
// the test (there is no kubelet); the router pods run the real
// skein-egress; kube-proxy's DNAT of the Service is emulated with
// nftables; an "external" namespace behind a veth serves TCP and UDP
// echoes that tell each client the source address they saw.
//
// Steps, both families each: the annotated client's TCP and UDP leave
// through a router (its address seen outside, never the client's), with
// the node tracking the tunnel DNAT'd to that router; the router's Pod
// deleted (endpoints, conntrack, process, DEL) moves new connections to
// the other router and leaves nothing in its namespace; the annotation
// removed takes the tunnels away (traffic leaves directly, from the
// client's address) and put back restores them; a restarted skeind keeps
// the tunnels and follows the annotation; DEL leaves nothing; an Egress
// with per-flow source ports spreads connections over its two routers; a
// pod naming a missing Egress fails its ADD cleanly. The routers' and
// skeind's metrics are checked along the way.
func TestEgressClusterInside(t *testing.T) {
	guest.RequireGuest(t)
	kc := os.Getenv(envKubeconfig)
	if kc == "" {
		t.Skipf("skipping: $%s is not set; TestEgressCluster runs this test in the guest", envKubeconfig)
	}
	start := time.Now()
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClient(rc)
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{c: c, kubeconfig: kc, routers: map[string]*router{}}
	cl.nat, cl.auto = cl.readEgress(t, egressName), cl.readEgress(t, autoEgressName)

	// The node: forwarding on (skeind's --node-forwarding too), pods'
	// traffic to the API server masqueraded out of the guest's NIC.
	hostNAT(t)
	cl.node = kubenode.StartNode(t, kc, nodeName, kubenode.NodeOptions{Args: []string{
		"--node-netns", "", "--mtu", "1500", "--node-forwarding=true", "--log-level", "debug",
	}})
	ext := startExternal(t)
	t.Logf("node up in %v", time.Since(start).Round(time.Millisecond))

	// Two router pods with the Deployment's labels, each running
	// skein-egress; kube-proxy's DNAT sends the Service to both.
	ra := cl.startRouter(t, cl.nat, "nat-router-a")
	rb := cl.startRouter(t, cl.nat, "nat-router-b")
	routers := []*router{ra, rb}
	proxy := newProxy(t, cl.nat, cl.auto)
	cl.syncEndpoints(t, proxy)
	if len(cl.nat.endpoints) != 2 {
		t.Fatalf("the Service %s has endpoints %v, want the two routers", egressName, cl.nat.endpoints)
	}
	t.Logf("routers %s (%v) and %s (%v) up in %v", ra.name, ra.pod.Addrs, rb.name, rb.pod.Addrs, time.Since(start).Round(time.Millisecond))

	// The client pod, annotated for the Egress.
	cp := cl.addPod(t, clientNS, "client", nil, map[string]string{skeinv1.AnnotationEgressPrefix + egressNS: egressName})
	client4, client6 := cp.Addr(false), cp.Addr(true)
	t.Logf("client %v up in %v", cp.Addrs, time.Since(start).Round(time.Millisecond))
	cl.wantTunnels(t, cp, true)
	cl.wantEgressPods(t, 1)

	byAddr := map[netip.Addr]*router{}
	for _, r := range routers {
		for _, a := range r.pod.Addrs {
			byAddr[a] = r
		}
	}
	// through returns the router behind source address src (nil if none).
	through := func(src netip.Addr) *router { return byAddr[src] }

	var used *router
	t.Run("through a router", func(t *testing.T) {
		for _, dst := range []netip.Addr{ext.addr4, ext.addr6} {
			for _, proto := range []string{"tcp", "udp"} {
				src := eventuallySource(t, cp, proto, dst, 60*time.Second, func(src netip.Addr) string {
					if through(src) == nil {
						return fmt.Sprintf("seen from %v, no router's address", src)
					}
					return ""
				})
				r := through(src)
				t.Logf("%s to %v: the server saw %v, router %s", proto, dst, src, r.name)
				if used == nil {
					used = r
				}
				// The emulated kube-proxy hands a family's first flow
				// to the first endpoint: one router carries all, so
				// that removing it moves both families.
				if r != used {
					t.Errorf("%s to %v went through %s, the earlier flows through %s", proto, dst, r.name, used.name)
				}
			}
		}
		cl.wantRouterMetrics(t, used, 1)
		// kube-proxy's DNAT and the fixed source port: the node tracks
		// the client's tunnel as client:5555 -> ClusterIP:5555 whose
		// reply is router:5555 -> client:5555, what the router sends;
		// so the reply reaches the client from the ClusterIP, its
		// tunnel's remote end.
		for _, v6 := range []bool{false, true} {
			cip := cl.nat.cip4
			if v6 {
				cip = cl.nat.cip6
			}
			wantFoUFlow(t, cp.Addr(v6), cip, used.pod.Addr(v6))
		}
		// The router's SNAT is in a table of its own.
		if tables := nftTables(t, used.pod.NS); !slices.Contains(tables, "skein-egress") {
			t.Errorf("router %s's namespace has nftables tables %v, want skein-egress among them", used.name, tables)
		}
	})
	if used == nil {
		t.FailNow()
	}
	ext.wantNeverSaw(t, client4, client6)

	t.Run("a router removed", func(t *testing.T) {
		gone := used
		used = ra // the one left, for the steps after this one
		if gone == ra {
			used = rb
		}
		// As in a cluster: the Pod is deleted, the endpoints follow,
		// kube-proxy drops the UDP flows to the gone endpoint, the
		// container stops, the runtime DELs the pod.
		if err := cl.c.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: egressNS, Name: gone.name}}); err != nil {
			t.Fatalf("delete pod %s: %v", gone.name, err)
		}
		cl.syncEndpoints(t, proxy)
		if len(cl.nat.endpoints) != 1 || cl.nat.endpoints[0] != used {
			t.Fatalf("after deleting pod %s the Service %s has endpoints %v, want %s only", gone.name, egressName, cl.nat.endpoints, used.name)
		}
		flushConntrack(t, gone)
		gone.stop(t)
		if err := gone.pod.Del(t); err != nil {
			t.Fatal(err)
		}
		wantNothingLeft(t, gone.pod.NS, "the namespace of router "+gone.name+" after skein-egress stopped and its DEL")
		for _, dst := range []netip.Addr{ext.addr4, ext.addr6} {
			for _, proto := range []string{"tcp", "udp"} {
				src := eventuallySource(t, cp, proto, dst, 30*time.Second, func(src netip.Addr) string {
					if through(src) != used {
						return fmt.Sprintf("seen from %v, not router %s's address (%v)", src, used.name, used.pod.Addrs)
					}
					return ""
				})
				t.Logf("%s to %v after %s went: the server saw %v (%s)", proto, dst, gone.name, src, used.name)
			}
		}
		cl.wantRouterMetrics(t, used, 1)
	})
	ext.wantNeverSaw(t, client4, client6)

	t.Run("annotation removed", func(t *testing.T) {
		cl.patchAnnotation(t, cp, nil)
		kubenode.Eventually(t, 30*time.Second, "skeind removing the client's tunnels", func() string {
			return cl.tunnelProblem(cp, false)
		})
		cl.wantEgressPods(t, 0)
		for _, dst := range []netip.Addr{ext.addr4, ext.addr6} {
			want := client4
			if dst.Is6() {
				want = client6
			}
			for _, proto := range []string{"tcp", "udp"} {
				eventuallySource(t, cp, proto, dst, 30*time.Second, func(src netip.Addr) string {
					if src != want {
						return fmt.Sprintf("seen from %v, not the client's own %v", src, want)
					}
					return ""
				})
			}
		}
		cl.wantRouterMetrics(t, used, 0)
	})

	viaRouter := func(t *testing.T) {
		t.Helper()
		for _, dst := range []netip.Addr{ext.addr4, ext.addr6} {
			eventuallySource(t, cp, "tcp", dst, 30*time.Second, func(src netip.Addr) string {
				if through(src) != used {
					return fmt.Sprintf("seen from %v, not router %s's address", src, used.name)
				}
				return ""
			})
		}
	}
	annotate := func(t *testing.T, on bool) {
		t.Helper()
		if !on {
			cl.patchAnnotation(t, cp, nil)
		} else {
			cl.patchAnnotation(t, cp, map[string]string{skeinv1.AnnotationEgressPrefix + egressNS: egressName})
		}
		kubenode.Eventually(t, 30*time.Second, fmt.Sprintf("skeind following the client's annotation (tunnels wanted: %v)", on), func() string {
			return cl.tunnelProblem(cp, on)
		})
	}

	t.Run("annotation back", func(t *testing.T) {
		annotate(t, true)
		cl.wantEgressPods(t, 1)
		viaRouter(t)
	})

	t.Run("skeind restarted", func(t *testing.T) {
		// The tunnels outlive skeind, and the new one finds the running
		// pod again (by its addresses) and follows its annotation.
		cl.node.D.Stop(t)
		cl.node.D.Start(t)
		if p := cl.tunnelProblem(cp, true); p != "" {
			t.Errorf("after skeind's restart: %s", p)
		}
		viaRouter(t)
		annotate(t, false)
		annotate(t, true)
		viaRouter(t)
	})

	t.Run("DEL", func(t *testing.T) {
		if err := cp.Del(t); err != nil {
			t.Fatal(err)
		}
		cl.wantTunnels(t, cp, false)
		wantNothingLeft(t, cp.NS, "the client's namespace after DEL")
		cl.wantEgressPods(t, 0)
	})
	t.Run("source port Auto: flows spread over the routers", func(t *testing.T) {
		a1 := cl.startRouter(t, cl.auto, "auto-router-a")
		a2 := cl.startRouter(t, cl.auto, "auto-router-b")
		cl.syncEndpoints(t, proxy)
		if len(cl.auto.endpoints) != 2 {
			t.Fatalf("the Service %s has endpoints %v, want %s and %s", autoEgressName, cl.auto.endpoints, a1.name, a2.name)
		}
		ap := cl.addPod(t, clientNS, "client-auto", nil, map[string]string{skeinv1.AnnotationEgressPrefix + egressNS: autoEgressName})
		autoBy := map[netip.Addr]*router{}
		for _, r := range cl.auto.endpoints {
			for _, a := range r.pod.Addrs {
				autoBy[a] = r
			}
		}
		for _, dst := range []netip.Addr{ext.addr4, ext.addr6} {
			for _, proto := range []string{"tcp", "udp"} {
				src := eventuallySource(t, ap, proto, dst, 60*time.Second, func(src netip.Addr) string {
					if autoBy[src] == nil {
						return fmt.Sprintf("seen from %v, no address of the Egress %s's routers", src, autoEgressName)
					}
					return ""
				})
				t.Logf("%s to %v: the server saw %v, router %s", proto, dst, src, autoBy[src].name)
			}
		}
		// Each connection is a flow of its own outside the tunnel (its
		// own source port), so kube-proxy's DNAT picks a router for each:
		// round-robin here, both routers carry some.
		seen := map[string]int{}
		for i := 0; i < 6; i++ {
			src, err := echo(ap.NS, "tcp", ext.addr4)
			if err != nil {
				t.Errorf("connection %d: %v", i+1, err)
				continue
			}
			r := autoBy[src]
			if r == nil {
				t.Errorf("connection %d: the server saw %v, no address of the Egress %s's routers", i+1, src, autoEgressName)
				continue
			}
			seen[r.name]++
		}
		t.Logf("6 connections by router: %v", seen)
		if len(seen) != 2 {
			t.Errorf("6 connections through the Egress %s went through routers %v; want both (one flow each outside, spread by the DNAT)", autoEgressName, seen)
		}
		cl.wantRouterMetrics(t, a1, 1)
		ext.wantNeverSaw(t, ap.Addrs...)
	})

	t.Run("a pod naming a missing Egress", func(t *testing.T) { cl.missingEgress(t) })
	t.Logf("inner test done in %v", time.Since(start).Round(time.Millisecond))
}

// missingEgress: the ADD of a pod naming an Egress that does not exist
// fails with an error naming it, leaves the pod's namespace and the node
// without an attachment, and the Pod gets a Warning event.
func (cl *cluster) missingEgress(t *testing.T) {
	ctx := context.Background()
	const name = "stray"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: clientNS, Name: name,
			Annotations: map[string]string{skeinv1.AnnotationEgressPrefix + egressNS: "missing"}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "main", Image: "skein:dev"}}},
	}
	if err := cl.c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	before := len(cl.node.D.Attachments(t))
	ns := harness.NewNS(t, "pod")
	rt := skeintest.RT(name, ns.Path(), "eth0")
	rt.Args = [][2]string{{"K8S_POD_NAMESPACE", clientNS}, {"K8S_POD_NAME", name}}
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := cl.node.D.CNI().AddNetworkList(actx, cl.node.ConfList(t), rt)
	want := "Egress " + egressNS + "/missing not found"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ADD of a pod naming a missing Egress: %v; want an error saying %q", err, want)
	}
	wantNothingLeft(t, ns, "the namespace of a pod whose ADD failed")
	if n := len(cl.node.D.Attachments(t)); n != before {
		t.Errorf("skeind holds %d attachments after the failed ADD, %d before", n, before)
	}
	kubenode.Eventually(t, 20*time.Second, "a Warning event on pod "+name, func() string {
		var evs corev1.EventList
		if err := cl.c.List(ctx, &evs, client.InNamespace(clientNS)); err != nil {
			return err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == name && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "missing") {
				return ""
			}
			seen = append(seen, e.InvolvedObject.Name+": "+e.Reason)
		}
		return fmt.Sprintf("events %v", seen)
	})
}

// readEgress reads the Egress's Service (both ClusterIPs) and the router
// pods' labels from its Deployment.
func (cl *cluster) readEgress(t *testing.T, name string) *gateway {
	t.Helper()
	ctx := context.Background()
	key := client.ObjectKey{Namespace: egressNS, Name: name}
	gw := &gateway{name: name}
	var svc corev1.Service
	if err := cl.c.Get(ctx, key, &svc); err != nil {
		t.Fatalf("the Egress's Service: %v", err)
	}
	for _, s := range svc.Spec.ClusterIPs {
		a := netip.MustParseAddr(s)
		if a.Is4() {
			gw.cip4 = a
		} else {
			gw.cip6 = a
		}
	}
	if !gw.cip4.IsValid() || !gw.cip6.IsValid() {
		t.Fatalf("Service %s has ClusterIPs %v, want one per family", key, svc.Spec.ClusterIPs)
	}
	var dep appsv1.Deployment
	if err := cl.c.Get(ctx, key, &dep); err != nil {
		t.Fatalf("the Egress's Deployment: %v", err)
	}
	gw.selector = svc.Spec.Selector
	if len(gw.selector) == 0 {
		t.Fatalf("Service %s has no selector", key)
	}
	gw.labels = dep.Spec.Template.Labels
	if len(gw.labels) == 0 {
		t.Fatalf("Deployment %s has a pod template without labels", key)
	}
	return gw
}

// addPod creates the Pod object (bound to the node), ADDs its namespace
// through the skein CNI plugin and, as a kubelet would, writes its
// addresses and phase Running into its status.
func (cl *cluster) addPod(t *testing.T, namespace, name string, labels, annotations map[string]string) *kubenode.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:   nodeName,
			Containers: []corev1.Container{{Name: "main", Image: "skein:dev"}},
		},
	}
	if err := cl.c.Create(ctx, pod); err != nil {
		t.Fatalf("create pod %s/%s: %v", namespace, name, err)
	}
	p := cl.node.MustAddPod(t, namespace, name)
	t.Cleanup(func() { // before the namespace goes (cleanups run last first)
		if t.Failed() {
			t.Logf("pod %s/%s's namespace:\n%s", namespace, name, describeNS(p.NS))
		}
	})
	if len(p.Addrs) != 2 {
		t.Fatalf("pod %s/%s got addresses %v, want one per family", namespace, name, p.Addrs)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = p.Addrs[0].String()
	pod.Status.PodIPs = nil
	for _, a := range p.Addrs {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: a.String()})
	}
	if err := cl.c.Status().Update(ctx, pod); err != nil {
		t.Fatalf("write the status of pod %s/%s: %v", namespace, name, err)
	}
	return p
}

// patchAnnotation replaces the client pod's egress annotations.
func (cl *cluster) patchAnnotation(t *testing.T, p *kubenode.Pod, ann map[string]string) {
	t.Helper()
	key := skeinv1.AnnotationEgressPrefix + egressNS
	var patch string
	if v, ok := ann[key]; ok {
		patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, v)
	} else {
		patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, key)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.RT.ContainerID}}
	if err := cl.c.Patch(context.Background(), pod, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("patch the annotations of pod %s: %v", p.RT.ContainerID, err)
	}
}

// router is a router pod running skein-egress.
type router struct {
	name string
	pod  *kubenode.Pod
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startRouter makes a router pod of gw and runs skein-egress inside its
// namespace, as the Deployment's container would (the downward API's
// POD_IPS, the Egress's name), and waits until it is ready.
func (cl *cluster) startRouter(t *testing.T, gw *gateway, name string) *router {
	t.Helper()
	p := cl.addPod(t, egressNS, name, gw.labels, nil)
	r := &router{name: name, pod: p, log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	cl.routers[name] = r
	logf, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	var ips []string
	for _, a := range p.Addrs {
		ips = append(ips, a.String())
	}
	r.cmd = exec.Command(filepath.Join(os.Getenv("SKEIN_BIN_DIR"), "skein-egress"),
		"--egress-name", gw.name, "--egress-namespace", egressNS, "--kubeconfig", cl.kubeconfig,
		"--metrics-addr", fmt.Sprintf(":%d", routerMetricsPort), "--log-level", "debug")
	r.cmd.Env = append(os.Environ(), "POD_IPS="+strings.Join(ips, ","))
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The child is forked from the thread inside the pod's namespace.
	if err := p.NS.Do(r.cmd.Start); err != nil {
		t.Fatalf("start skein-egress in %s: %v", name, err)
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(r.log)
			t.Logf("log of skein-egress in %s:\n%s", name, b)
		}
	})
	kubenode.Eventually(t, kubenode.Wait, "skein-egress in "+name+" ready", func() string {
		select {
		case <-r.done:
			b, _ := os.ReadFile(r.log)
			t.Fatalf("skein-egress in %s exited: %v\n%s", name, r.cmd.ProcessState, b)
		default:
		}
		return httpProblem(r.url("/readyz"))
	})
	return r
}

// String names the router (in messages).
func (r *router) String() string { return r.name }

// syncEndpoints does the EndpointSlice controller's work for the
// gateways' Services and hands the result to the emulated kube-proxy:
// the pods the Service selects that are running, have addresses and are
// not being deleted, by name.
func (cl *cluster) syncEndpoints(t *testing.T, p *proxy) {
	t.Helper()
	for _, gw := range []*gateway{cl.nat, cl.auto} {
		var pods corev1.PodList
		if err := cl.c.List(context.Background(), &pods, client.InNamespace(egressNS), client.MatchingLabels(gw.selector)); err != nil {
			t.Fatalf("list the pods of Service %s: %v", gw.name, err)
		}
		gw.endpoints = nil
		for _, pod := range pods.Items {
			if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || len(pod.Status.PodIPs) == 0 {
				continue
			}
			r := cl.routers[pod.Name]
			if r == nil {
				t.Fatalf("Service %s selects pod %s, which is no router of this test", gw.name, pod.Name)
			}
			gw.endpoints = append(gw.endpoints, r)
		}
		slices.SortFunc(gw.endpoints, func(a, b *router) int { return strings.Compare(a.name, b.name) })
	}
	p.sync(t)
}

// url is a path of the router's metrics server, reached from the node.
func (r *router) url(path string) string {
	return fmt.Sprintf("http://%s:%d%s", r.pod.Addr(false), routerMetricsPort, path)
}

// stop SIGTERMs skein-egress (it removes its data plane) and waits.
func (r *router) stop(t *testing.T) {
	select {
	case <-r.done:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
		t.Errorf("skein-egress in %s did not stop on SIGTERM", r.name)
	}
}

// wantRouterMetrics waits until the router's metrics count clients
// clients and a tunnel per client and family.
func (cl *cluster) wantRouterMetrics(t *testing.T, r *router, clients int) {
	t.Helper()
	kubenode.Eventually(t, 30*time.Second, "the metrics of skein-egress in "+r.name, func() string {
		var got []string
		for _, m := range []struct {
			name string
			want int
		}{{"skein_egress_clients", clients}, {"skein_egress_tunnels", 2 * clients}} {
			v, err := kubenode.SampleErr(r.url("/metrics"), m.name)
			if err != nil {
				return err.Error()
			}
			if v != fmt.Sprint(m.want) {
				got = append(got, fmt.Sprintf("%s %q (want %d)", m.name, v, m.want))
			}
		}
		if clients > 0 {
			// Traffic went through: the SNAT rules counted it, the
			// kernel tracks the client's connections.
			for _, name := range []string{"skein_egress_packets_total", "skein_egress_conntrack_entries"} {
				v, err := kubenode.SampleErr(r.url("/metrics"), name)
				if err != nil {
					return err.Error()
				}
				if n, err := strconv.ParseFloat(v, 64); err != nil || n <= 0 {
					got = append(got, fmt.Sprintf("%s %q (want > 0)", name, v))
				}
			}
		}
		return strings.Join(got, ", ")
	})
}

// wantEgressPods waits until skeind counts n pods with egress tunnels.
func (cl *cluster) wantEgressPods(t *testing.T, n int) {
	t.Helper()
	kubenode.Eventually(t, 10*time.Second, "skeind's skein_egress_pods", func() string {
		v, err := kubenode.SampleErr(cl.node.Metrics, "skein_egress_pods")
		if err != nil {
			return err.Error()
		}
		if v != fmt.Sprint(n) {
			return fmt.Sprintf("%q (want %d)", v, n)
		}
		return ""
	})
}

// wantFoUFlow checks the node's connection tracking of the client's
// tunnel: client:port -> cip:port, DNAT'd so that its reply is
// router:port -> client:port.
func wantFoUFlow(t *testing.T, client, cip, router netip.Addr) {
	t.Helper()
	fam := netlink.InetFamily(unix.AF_INET)
	if client.Is6() {
		fam = unix.AF_INET6
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil {
		t.Fatalf("list the node's conntrack table: %v", err)
	}
	port := uint16(egress.DefaultPort)
	var seen []string
	for _, f := range flows {
		if f.Forward.Protocol != unix.IPPROTO_UDP || !f.Forward.SrcIP.Equal(client.AsSlice()) {
			continue
		}
		seen = append(seen, f.String())
		if f.Forward.DstIP.Equal(cip.AsSlice()) && f.Forward.SrcPort == port && f.Forward.DstPort == port &&
			f.Reverse.SrcIP.Equal(router.AsSlice()) && f.Reverse.SrcPort == port && f.Reverse.DstPort == port {
			return
		}
	}
	t.Errorf("the node tracks no flow %v:%d -> %v:%d with reply %v:%d -> %v:%d; UDP flows of the client: %v",
		client, port, cip, port, router, port, client, port, seen)
}

// errNoSource: the echo answered nothing usable.
var errNoSource = errors.New("no source address in the echo")

// eventuallySource repeats a TCP or UDP echo from the pod to dst until
// judge accepts the source address the server saw ("" = accepted), and
// returns it.
func eventuallySource(t *testing.T, p *kubenode.Pod, proto string, dst netip.Addr, within time.Duration, judge func(netip.Addr) string) netip.Addr {
	t.Helper()
	var src netip.Addr
	kubenode.Eventually(t, within, fmt.Sprintf("%s echo from %s to %v", proto, p.RT.ContainerID, dst), func() string {
		var err error
		src, err = echo(p.NS, proto, dst)
		if err != nil {
			return err.Error()
		}
		return judge(src)
	})
	return src
}

// kernelLinks are the links a new namespace has here: lo and the
// fallback devices the ipip and ip6_tunnel modules make in every
// namespace.
var kernelLinks = []string{"ip6tnl0", "lo", "tunl0"}

// wantNothingLeft fails t unless ns is as a new namespace: only
// kernelLinks, only the default policy rules, no FoU port, no nftables
// table.
func wantNothingLeft(t *testing.T, ns *harness.NS, what string) {
	t.Helper()
	var h *netlink.Handle
	err := ns.Do(func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if !slices.Contains(kernelLinks, l.Attrs().Name) {
			t.Errorf("%s holds link %s (%s); want only %v", what, l.Attrs().Name, l.Type(), kernelLinks)
		}
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := h.RuleList(fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			if r.Priority != 0 && r.Priority != 32766 && r.Priority != 32767 {
				t.Errorf("%s holds rule pref %d lookup %d (family %d); want only the default rules", what, r.Priority, r.Table, fam)
			}
		}
		fous, err := h.FouList(fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fous {
			t.Errorf("%s holds FoU port %d (family %d)", what, f.Port, fam)
		}
	}
	if tables := nftTables(t, ns); len(tables) > 0 {
		t.Errorf("%s holds nftables tables %v", what, tables)
	}
}

// nftTables lists the names of the nftables tables in ns.
func nftTables(t *testing.T, ns *harness.NS) []string {
	t.Helper()
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatalf("list nftables tables in %s: %v", ns.Name(), err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, tb.Name)
	}
	return names
}

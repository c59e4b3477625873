package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/egresscontroller"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/egress/router"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/skeintest"
)

func TestFlagCheck(t *testing.T) {
	good := flags{name: "nat", namespace: "gw", port: 5555, outInterface: "eth0", coalesce: 0, resync: time.Minute}
	if err := good.check(); err != nil {
		t.Errorf("good flags: %v", err)
	}
	for name, mod := range map[string]func(*flags){
		"no name":           func(f *flags) { f.name = "" },
		"no namespace":      func(f *flags) { f.namespace = "" },
		"port 0":            func(f *flags) { f.port = 0 },
		"port too big":      func(f *flags) { f.port = 70000 },
		"no interface":      func(f *flags) { f.outInterface = "" },
		"negative coalesce": func(f *flags) { f.coalesce = -time.Second },
		"zero resync":       func(f *flags) { f.resync = 0 },
	} {
		f := good
		mod(&f)
		if err := f.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLocalAddrs(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.2.0.5"), netip.MustParseAddr("fd02::5")
	for _, tc := range []struct {
		name   string
		env    map[string]string
		w4, w6 netip.Addr
		err    string
	}{
		{"dual stack", map[string]string{"POD_IPS": "10.2.0.5,fd02::5", "POD_IP": "10.9.9.9"}, v4, v6, ""},
		{"v6 first, spaces", map[string]string{"POD_IPS": " fd02::5 , 10.2.0.5"}, v4, v6, ""},
		{"POD_IP alone", map[string]string{"POD_IP": "10.2.0.5"}, v4, netip.Addr{}, ""},
		{"v6 only", map[string]string{"POD_IPS": "fd02::5"}, netip.Addr{}, v6, ""},
		{"garbage", map[string]string{"POD_IPS": "10.2.0.5,bogus"}, netip.Addr{}, netip.Addr{}, "POD_IPS"},
	} {
		g4, g6, err := localAddrs(func(k string) string { return tc.env[k] }, flags{outInterface: "eth0"})
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err %v, want one naming %s", tc.name, err, tc.err)
		case tc.err == "" && (err != nil || g4 != tc.w4 || g6 != tc.w6):
			t.Errorf("%s: %v %v %v, want %v %v", tc.name, g4, g6, err, tc.w4, tc.w6)
		}
	}
}

// The addresses of --out-interface, when the downward API gave none.
func TestLocalAddrsFromInterface(t *testing.T) {
	ns := podNS(t, "egaddr", "10.3.0.7/24")
	g4, g6, err := localAddrs(func(string) string { return "" }, flags{outInterface: "eth0", netns: ns.Path()})
	if err != nil || g4 != netip.MustParseAddr("10.3.0.7") || g6.IsValid() {
		t.Errorf("from eth0: %v %v %v, want 10.3.0.7 and no IPv6", g4, g6, err)
	}
	if _, _, err := localAddrs(func(string) string { return "" }, flags{outInterface: "nope0", netns: ns.Path()}); err == nil || !strings.Contains(err.Error(), "nope0") {
		t.Errorf("missing interface: %v, want an error naming it", err)
	}
}

// podNS is a namespace standing in for a router pod: eth0, a veth to
// another namespace, with prefix on it.
func podNS(t *testing.T, name, prefix string) *harness.NS {
	t.Helper()
	ns, node := harness.NewNS(t, name), harness.NewNS(t, name+"-node")
	ns.AddVeth(t, harness.Veth{Name: "eth0", PeerName: "veth0", Peer: node})
	ns.AddAddr(t, "eth0", netip.MustParsePrefix(prefix))
	return ns
}

const (
	routerUser = "skein-egress-router"
	egNS       = "gateways"
)

// startKube runs the API server with the Egress gateways/nat, and a user
// holding what skein-controller grants a router account (deploy/
// kubernetes's ClusterRole skein-egress, bound in the Egress's namespace
// only, and the Egress by name), nothing cluster-wide.
func startKube(t *testing.T) (*kube.Env, string) {
	t.Helper()
	env := kube.Start(t, kube.Options{Users: []kube.User{{Name: routerUser}}})
	if out, err := env.Kubectl("apply", "-f", "../../deploy/kubernetes/egress-rbac.yaml"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	c, err := kube.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egNS}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: "skein-egress-" + egNS},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "skein-egress"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: routerUser}},
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: "skein-egress"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"skein.dev"}, Resources: []string{"egresses"},
				ResourceNames: []string{"nat", "missing"}, Verbs: []string{"get", "list", "watch"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: "skein-egress"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "skein-egress"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: routerUser}},
		},
		&skeinv1.Egress{
			ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: "nat"},
			Spec:       skeinv1.EgressSpec{Destinations: []string{"0.0.0.0/0"}},
		},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: egNS, Name: "client",
				Annotations: map[string]string{skeinv1.AnnotationEgressPrefix + egNS: "nat"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example/app"}}},
		},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	p := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: egNS, Name: "client"}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.Phase, p.Status.PodIPs = corev1.PodRunning, []corev1.PodIP{{IP: "10.4.0.2"}}
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	kc, err := env.WriteKubeconfig(routerUser)
	if err != nil {
		t.Fatal(err)
	}
	return env, kc
}

// fakeDP is a data plane that holds what it was given.
type fakeDP struct{ peers chan []netip.Addr }

func (f *fakeDP) SyncPeers(p []netip.Addr) error {
	select {
	case f.peers <- p:
	default:
	}
	return nil
}
func (f *fakeDP) SyncDestinations([]netip.Prefix) error { return nil }
func (f *fakeDP) Stats() (router.Stats, error) {
	return router.Stats{Tunnels: 1, Peers: 1, Packets: 7}, nil
}
func (f *fakeDP) Close() error { return nil }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestRunServes: the command's run, with the router's least permissions
// and a fake data plane, serves probes and metrics on --metrics-addr and
// stops cleanly when its context ends (SIGTERM's path).
func TestRunServes(t *testing.T) {
	_, kc := startKube(t)
	t.Setenv("POD_IPS", "10.4.0.100")
	addr := freeAddr(t)
	dp := &fakeDP{peers: make(chan []netip.Addr, 1)}
	var opened router.DataplaneConfig
	open := func(cfg router.DataplaneConfig) (router.Dataplane, error) { opened = cfg; return dp, nil }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	fl := flags{name: "nat", namespace: egNS, port: 5555, outInterface: "eth0", metricsAddr: addr, kubeconfig: kc,
		coalesce: 10 * time.Millisecond, resync: time.Minute, logLevel: "info", logFormat: "text"}
	go func() { done <- run(ctx, fl, open) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("run did not return after its context ended")
		}
	}()
	select {
	case p := <-dp.peers:
		if len(p) != 1 || p[0] != netip.MustParseAddr("10.4.0.2") {
			t.Errorf("synced %v, want the client 10.4.0.2", p)
		}
	case err := <-done:
		t.Fatalf("run ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no sync within 30 s")
	}
	if opened.Local4 != netip.MustParseAddr("10.4.0.100") || opened.Port != 5555 || opened.OutInterface != "eth0" {
		t.Errorf("data plane opened with %+v, want $POD_IPS's address, port 5555, eth0", opened)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := httpGet("http://" + addr + "/readyz")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz: %d %v", code, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, err := httpGet("http://" + addr + "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("healthz: %d %v", code, err)
	}
	_, body, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skein_egress_clients 1", "skein_egress_tunnels 1", "skein_egress_packets_total 7", "skein_egress_sync_errors_total 0"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestBinaryWithoutFoU: the real binary, on this host's kernel (no fou),
// exits non-zero with an error naming fou; it neither hangs nor crashes,
// and leaves the host and its namespace as they were.
func TestBinaryWithoutFoU(t *testing.T) {
	harness.RequireRoot(t)
	bin := filepath.Join(skeintest.Binaries(t), "skein-egress")
	_, kc := startKube(t)
	ns := podNS(t, "egrouter", "10.4.0.100/24")
	host := harness.HostNet(t)
	before := harness.Snapshot(t, ns)

	var out bytes.Buffer
	cmd := exec.Command(bin, "--kubeconfig", kc, "--egress-name", "nat", "--egress-namespace", egNS,
		"--netns", ns.Path(), "--metrics-addr", freeAddr(t))
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "POD_IPS=") // the address of eth0 in the namespace
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("skein-egress still running after 60 s:\n%s", out.String())
	}
	msg := out.String()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("skein-egress ended with %v, want exit status 1:\n%s", err, msg)
	}
	if strings.Contains(msg, "panic") || strings.Contains(msg, "goroutine ") {
		t.Errorf("skein-egress crashed:\n%s", msg)
	}
	last := lastLine(msg)
	t.Logf("skein-egress exited with status 1: %s", last)
	if !strings.HasPrefix(last, "skein-egress: ") {
		t.Errorf("last line %q: want the error, prefixed skein-egress:", last)
	}
	after := harness.Snapshot(t, ns)
	harness.AssertSame(t, before, after)
	harness.AssertHostSame(t, host, "skein-egress failed")
	if !strings.Contains(last, "fou") {
		t.Errorf("error %q does not name fou", last)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// The controller's router pods run this command: its arguments parse, and
// its readiness probe reaches the default --metrics-addr.
func TestControllerPodAgrees(t *testing.T) {
	eg := &skeinv1.Egress{ObjectMeta: metav1.ObjectMeta{Namespace: "gw", Name: "nat"}}
	r := &egresscontroller.Reconciler{}
	tmpl := r.PodTemplate(eg)
	ctr := tmpl.Spec.Containers[0]
	cmd := newCommand()
	if err := cmd.ParseFlags(ctr.Args); err != nil {
		t.Fatalf("the controller's args %q: %v", ctr.Args, err)
	}
	if got := cmd.Flags().Lookup("egress-name").Value.String(); got != "nat" {
		t.Errorf("--egress-name %q", got)
	}
	def := cmd.Flags().Lookup("metrics-addr").DefValue
	if want := ":" + strconv.Itoa(ctr.ReadinessProbe.HTTPGet.Port.IntValue()); def != want {
		t.Errorf("--metrics-addr defaults to %q, the controller probes %q", def, want)
	}
	if ctr.Command[0] != "skein-egress" {
		t.Errorf("the controller runs %q", ctr.Command)
	}
}

// The real binary waits, not ready, for an Egress that does not exist
// (yet), and ends cleanly on SIGTERM.
func TestBinaryWaitsForEgressAndStops(t *testing.T) {
	bin := filepath.Join(skeintest.Binaries(t), "skein-egress")
	_, kc := startKube(t)
	addr := freeAddr(t)
	var out bytes.Buffer
	cmd := exec.Command(bin, "--kubeconfig", kc, "--egress-name", "missing", "--egress-namespace", egNS, "--metrics-addr", addr)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "POD_IPS=10.4.0.100")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err := httpGet("http://" + addr + "/readyz")
		if err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for Egress "+egNS+"/missing") {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("skein-egress ended (%v) while it should wait:\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("readyz %d %q %v, want 503 waiting for the Egress:\n%s", code, body, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _, err := httpGet("http://" + addr + "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("healthz while waiting: %d %v", code, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("skein-egress ended with %v after SIGTERM, want status 0:\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("skein-egress still running 30 s after SIGTERM:\n%s", out.String())
	}
}

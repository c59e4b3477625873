package egress

import (
	"context"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/guest"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/kube"
	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// The cluster the test builds: names shared by the host and guest halves.
const (
	nodeName   = "guest-node"
	egressNS   = "egress-ns"
	egressName = "nat"
	// autoEgressName is an Egress with the same destinations whose
	// tunnels pick their UDP source port per flow.
	autoEgressName = "auto"
	clientNS       = "default"
	// serviceCIDRs is the API server's ClusterIP range, dual-stack.
	serviceCIDRs = "10.0.0.0/24,fd00:10::/112"
)

// The external network, reached through the gateway.
var (
	extDst4 = netip.MustParsePrefix("192.0.2.0/24")
	extDst6 = netip.MustParsePrefix("2001:db8:ff::/64")
)

// Where the host's files are inside the guest, and the environment the
// inner test reads.
const (
	guestDir        = "/opt/skein"
	guestBinDir     = guestDir + "/bin"
	guestKubeconfig = guestDir + "/kubeconfig"
	envKubeconfig   = "SKEIN_EGRESS_KUBECONFIG"
)

// guestModules are the kernel modules the guest loads: tunnels, nftables
// NAT with numgen maps, conntrack over netlink (the routers' metrics and
// the test's flush), veth pairs.
func guestModules() []string {
	var m []string
	m = append(m, guest.TunnelModules...)
	m = append(m, guest.NftablesModules...)
	m = append(m, guest.VethModules...)
	return append(m, "nf_conntrack_netlink")
}

// TestEgressCluster: the host half. It starts etcd, kube-apiserver (a
// dual-stack ClusterIP range) and skein-controller, makes the pool, the
// Node guest-node and the Egresses egress-ns/nat (FoU source port Fixed)
// and egress-ns/auto (Auto) to 192.0.2.0/24 and 2001:db8:ff::/64, waits
// for the controller's Services to get their ClusterIPs, and boots the guest, which runs TestEgressClusterInside
// against the API server through a forwarded port.
func TestEgressCluster(t *testing.T) {
	if guest.InGuest() {
		t.Skip("skipping: the host half (TestEgressClusterInside runs in the guest)")
	}
	harness.RequireRoot(t)
	start := time.Now()
	kenv := kube.Start(t, kube.Options{APIServerArgs: []string{
		"--service-cluster-ip-range=" + serviceCIDRs,
		"--allow-privileged=true", // router pods are privileged (their sysctls)
	}})
	c, err := kube.NewClient(kenv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Create(ctx, kubenode.DefaultPool.DeepCopy()); err != nil {
		t.Fatalf("create pool: %v", err)
	}
	kubenode.CreateNode(t, c, nodeName, netip.MustParseAddr("10.0.2.15"))
	kc, err := kenv.WriteKubeconfig(kube.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	kubenode.StartController(t, kc, "skein-controller")
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: egressNS}}); err != nil {
		t.Fatalf("create namespace %s: %v", egressNS, err)
	}
	for name, port := range map[string]string{egressName: skeinv1.FoUSourcePortFixed, autoEgressName: skeinv1.FoUSourcePortAuto} {
		eg := &skeinv1.Egress{
			ObjectMeta: metav1.ObjectMeta{Namespace: egressNS, Name: name},
			Spec: skeinv1.EgressSpec{
				Destinations:  []string{extDst4.String(), extDst6.String()},
				Replicas:      ptr.To[int32](2),
				FoUSourcePort: port,
				// The clients are in another namespace than the Egress.
				ClientNamespaces: []string{clientNS},
			},
		}
		if err := c.Create(ctx, eg); err != nil {
			t.Fatalf("create Egress %s/%s: %v", egressNS, name, err)
		}
	}
	for _, name := range []string{egressName, autoEgressName} {
		var svc corev1.Service
		kubenode.Eventually(t, kubenode.Wait, "the Service of Egress "+name+" with an IPv4 and an IPv6 ClusterIP", func() string {
			if err := c.Get(ctx, client.ObjectKey{Namespace: egressNS, Name: name}, &svc); err != nil {
				return err.Error()
			}
			if len(svc.Spec.ClusterIPs) != 2 {
				return "ClusterIPs " + strings.Join(svc.Spec.ClusterIPs, ",")
			}
			return ""
		})
		t.Logf("Service %s/%s: ClusterIPs %v", egressNS, name, svc.Spec.ClusterIPs)
	}
	t.Logf("cluster ready in %v", time.Since(start).Round(time.Millisecond))

	bins := skeintest.Binaries(t)
	files := map[string]string{guestKubeconfig: guestKubeconfigFile(t, kenv)}
	for _, b := range []string{"skeind", "skein", "skein-egress"} {
		files[guestBinDir+"/"+b] = filepath.Join(bins, b)
	}
	port := apiPort(t, kenv.URL)
	res := guest.Run(t, guest.Config{
		Package:   "./test/egress",
		Run:       "^TestEgressClusterInside$",
		Modules:   guestModules(),
		Files:     files,
		HostPorts: []int{port},
		Env:       []string{"SKEIN_BIN_DIR=" + guestBinDir, envKubeconfig + "=" + guestKubeconfig},
		Timeout:   4 * time.Minute,
	})
	if res.Passed && !strings.Contains(res.Output, "--- PASS: TestEgressClusterInside") {
		t.Errorf("the guest run passed but TestEgressClusterInside did not report PASS (skipped?):\n%s", res.Output)
	}
	t.Logf("total %v (build %v, guest boot %v, guest run %v)", time.Since(start).Round(time.Millisecond),
		res.Build.Round(time.Millisecond), res.Boot.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond))
}

// apiPort is the port of the API server's URL (https://127.0.0.1:P).
func apiPort(t *testing.T, u string) int {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(pu.Port())
	if err != nil {
		t.Fatalf("API server URL %s: %v", u, err)
	}
	return p
}

// guestKubeconfigFile writes the admin's kubeconfig as the guest sees the
// API server: at guest.HostAddr, its certificate checked for 127.0.0.1.
func guestKubeconfigFile(t *testing.T, kenv *kube.Env) string {
	t.Helper()
	ca, err := os.ReadFile(kenv.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["guest"] = &clientcmdapi.Cluster{
		Server:                   "https://" + guest.HostAddr + ":" + strconv.Itoa(apiPort(t, kenv.URL)),
		CertificateAuthorityData: ca,
		TLSServerName:            "127.0.0.1",
	}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: kenv.Config.BearerToken}
	cfg.Contexts["guest"] = &clientcmdapi.Context{Cluster: "guest", AuthInfo: "admin"}
	cfg.CurrentContext = "guest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Package kube runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver, as built by scripts/deps.d/k8s.sh into a versioned cache
// outside the repository (AssetsDir), each on free ports of 127.0.0.1 with
// its own temporary directory, skein's CRDs installed. Start skips the
// test, naming the missing directory, when the binaries are not built.
//
// The API server authenticates with bearer tokens from a token file (an
// admin in system:masters, plus the users a test asks for) and authorizes
// with RBAC, so tests can check each component's least-privilege role.
// Start runs no kube-controller-manager: nothing garbage-collects by owner
// reference unless a test calls Env.StartGarbageCollector, and no token
// Secrets are made. The API server signs service account tokens with a
// key of its own (--service-account-signing-key-file): Env.NodeToken and
// Env.ServiceAccountToken ask for them through the TokenRequest API, a
// Pod-bound one carrying its node as a kubelet-mounted token does.
package kube

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The versions scripts/deps.d/k8s.sh builds; TestAssetsDirMatchesScript
// keeps the two in step.
const (
	KubernetesVersion = "v1.35.4"
	EtcdVersion       = "v3.6.5"
)

// AdminUser is the user of Env.Config, in the group system:masters.
const AdminUser = "skein-test-admin"

// AssetsDir is where the binaries are: $SKEIN_KUBE_ASSETS, else
// ~/.cache/skein/k8s-<version>-etcd-<version>.
func AssetsDir() string {
	if d := os.Getenv("SKEIN_KUBE_ASSETS"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "skein", "k8s-"+KubernetesVersion+"-etcd-"+EtcdVersion)
}

// binaries are the files Start needs from AssetsDir
// (ControllerManagerBinary is checked by StartGarbageCollector).
var binaries = []string{"etcd", "kube-apiserver", "kubectl"}

// Options configures Start. The zero value is usable.
type Options struct {
	// CRDDir holds the CRD manifests to install (*.yaml); "" is this
	// module's deploy/kubernetes/crd.
	CRDDir string
	// NoCRDs installs none (the test applies deploy/kubernetes itself,
	// as an operator does).
	NoCRDs bool
	// Users get a bearer token each, besides the admin (UserConfig).
	Users []User
	// APIServerArgs are extra kube-apiserver flags ("--name=value"); a
	// flag given here replaces Start's own of the same name.
	APIServerArgs []string
	// NetNS, when set, is the path of a network namespace etcd,
	// kube-apiserver and kube-controller-manager run in (test/kubelet's
	// control-plane namespace, where real nodes reach them); this
	// process reaches them there through Config's dialer. Address is the
	// API server's address in it (bind and advertise), 127.0.0.1 if
	// empty.
	NetNS   string
	Address string
	// ServingIPs are more addresses the API server's certificate names
	// (e.g. the first address of the Service range, which pods use).
	ServingIPs []net.IP
}

// User is an identity the API server accepts by token.
type User struct {
	Name   string
	Groups []string
}

// Env is a running etcd and kube-apiserver.
type Env struct {
	// Config reaches the API server as AdminUser.
	Config *rest.Config
	// Dir is the temporary directory holding the data, certificates and
	// logs (removed by Stop).
	Dir string
	// URL of the API server and CAFile, the PEM of the CA that signed its
	// serving certificate.
	URL    string
	CAFile string
	// EtcdURL is etcd's client URL (plain HTTP on 127.0.0.1).
	EtcdURL string

	tokens            map[string]string
	etcd              *proc
	apiserver         *proc
	controllerManager *proc // StartGarbageCollector's, or nil
	stopOnce          sync.Once
	// netns is Options.NetNS: the namespace the processes run in and
	// this process dials into ("" for its own).
	netns string
}

// Start runs etcd and kube-apiserver, waits until the API server is ready
// and the CRDs are served, and stops both at the end of the test (whatever
// its outcome). It skips the test when the binaries are missing.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	dir := AssetsDir()
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Skipf("no %s in %s: run scripts/install-deps.sh (make deps) to build the Kubernetes test binaries", b, dir)
		}
	}
	crdDir := opts.CRDDir
	if crdDir == "" {
		root, err := moduleRoot()
		if err != nil {
			t.Fatal(err)
		}
		crdDir = filepath.Join(root, "deploy", "kubernetes", "crd")
	}
	removeStaleDirs()
	tmp, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &Env{Dir: tmp, netns: opts.NetNS}
	t.Cleanup(func() {
		if t.Failed() {
			e.logTails(t)
		}
		e.Stop()
	})
	start := time.Now()
	if err := e.start(dir, opts); err != nil {
		t.Fatalf("start kube-apiserver and etcd: %v", err)
	}
	if opts.NoCRDs {
		crdDir = ""
	}
	if err := installCRDs(e.Config, crdDir); err != nil {
		t.Fatalf("install CRDs: %v", err)
	}
	t.Logf("kube-apiserver %s on %s, etcd %s on %s, ready in %v", KubernetesVersion, e.URL, EtcdVersion, e.EtcdURL,
		time.Since(start).Round(time.Millisecond))
	return e
}

// Stop stops kube-controller-manager (if started), kube-apiserver, then
// etcd, and removes Dir. It is safe to call more than once.
func (e *Env) Stop() {
	e.stopOnce.Do(func() {
		if e.controllerManager != nil {
			e.controllerManager.stop(10 * time.Second)
		}
		if e.apiserver != nil {
			e.apiserver.stop(10 * time.Second)
		}
		if e.etcd != nil {
			e.etcd.stop(10 * time.Second)
		}
		os.RemoveAll(e.Dir)
	})
}

// UserConfig reaches the API server as user, one of Options.Users (or
// AdminUser). It panics for a user Start was not given: a test bug.
func (e *Env) UserConfig(user string) *rest.Config {
	tok, ok := e.tokens[user]
	if !ok {
		panic(fmt.Sprintf("kube: no user %q (add it to Options.Users)", user))
	}
	c := rest.CopyConfig(e.Config)
	c.BearerToken = tok
	return c
}

// WriteKubeconfig writes a kubeconfig for user into Dir and returns its
// path, for processes the test starts (--kubeconfig).
func (e *Env) WriteKubeconfig(user string) (string, error) {
	c := e.UserConfig(user)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["skein-test"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthority: e.CAFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: c.BearerToken}
	cfg.Contexts["skein-test"] = &clientcmdapi.Context{Cluster: "skein-test", AuthInfo: user}
	cfg.CurrentContext = "skein-test"
	path := filepath.Join(e.Dir, "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig for %s: %w", user, err)
	}
	return path, nil
}

// Kubectl runs the cached kubectl as the admin and returns its output.
func (e *Env) Kubectl(args ...string) ([]byte, error) {
	kc, err := e.WriteKubeconfig(AdminUser)
	if err != nil {
		return nil, err
	}
	bin, argv := e.command(filepath.Join(AssetsDir(), "kubectl"), append([]string{"--kubeconfig", kc}, args...))
	cmd := exec.Command(bin, argv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// logTails prints the end of each component's log.
func (e *Env) logTails(t testing.TB) {
	t.Helper()
	for _, p := range []*proc{e.etcd, e.apiserver} {
		if p != nil {
			t.Logf("last lines of %s's log:\n%s", p.name, p.tail(25))
		}
	}
}

const (
	dirPrefix = "skein-kube-"
	ownerFile = "owner.pid"
)

// removeStaleDirs removes the directories of test processes that died
// before their cleanup ran (a timeout's panic): their etcd and API server
// died with them (Pdeathsig), their files stay.
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // not ours, or still being made
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// ModuleRoot returns the skein module's directory, found upwards from the
// working directory (a test's package directory).
func ModuleRoot() (string, error) { return moduleRoot() }

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/skeinnet/skein\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the skein module (no go.mod above the working directory)")
		}
		dir = parent
	}
}

// installCRDs is InstallCRDs, doing nothing for dir "".
func installCRDs(c *rest.Config, dir string) error {
	if dir == "" {
		return nil
	}
	return InstallCRDs(c, dir)
}

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ControllerManagerBinary is the kube-controller-manager in AssetsDir.
// Start does not need it, only StartGarbageCollector and
// StartControllerManager: a cache built before scripts/deps.d/k8s.sh
// added it skips just those tests.
const ControllerManagerBinary = "kube-controller-manager"

// gcTimeout bounds kube-controller-manager's start until its garbage
// collector has synced its informers (seen: about five seconds).
const gcTimeout = 90 * time.Second

// gcReadyLine is what the garbage collector logs once its informers have
// synced (or it gave up waiting on some) and it starts deleting.
const gcReadyLine = "Proceeding to collect garbage"

// StartGarbageCollector runs kube-controller-manager next to the API
// server with only its garbage collector, as the admin, so dependents
// whose owners are deleted go away as in a real cluster. It returns once
// the collector has synced its view of every resource the API server
// serves at that moment (CRDs installed later are picked up by its
// periodic rediscovery, about every 30 s). The process is stopped at the
// end of the test, or by Stop. It skips the test when the binary is
// missing.
func (e *Env) StartGarbageCollector(t testing.TB) {
	t.Helper()
	start := time.Now()
	p := e.startControllerManager(t, []string{"garbage-collector-controller"}, nil)
	if err := waitLogLine(p, gcTimeout, gcReadyLine); err != nil {
		t.Fatalf("start the garbage collector: %v", err)
	}
	t.Logf("%s %s (garbage collector only) ready in %v", ControllerManagerBinary, KubernetesVersion,
		time.Since(start).Round(time.Millisecond))
}

// StartControllerManager runs kube-controller-manager next to the API
// server with only controllers (the names --controllers takes, e.g.
// "validatingadmissionpolicy-status-controller", which type-checks
// ValidatingAdmissionPolicies into their status), as the admin. It
// returns once the process runs: the test waits for the effect it needs.
// Only one kube-controller-manager runs per Env (StartGarbageCollector's
// included). It is stopped at the end of the test, or by Stop; the test
// is skipped when the binary is missing.
func (e *Env) StartControllerManager(t testing.TB, controllers ...string) {
	t.Helper()
	if len(controllers) == 0 {
		t.Fatal("kube: StartControllerManager without controllers")
	}
	e.startControllerManager(t, controllers, nil)
	t.Logf("%s %s running %s", ControllerManagerBinary, KubernetesVersion, strings.Join(controllers, ","))
}

// StartControllerManagerArgs is StartControllerManager with more flags
// (e.g. --service-account-private-key-file for the token controller; a
// flag here comes after, so it wins over, the defaults).
func (e *Env) StartControllerManagerArgs(t testing.TB, controllers, args []string) {
	t.Helper()
	e.startControllerManager(t, controllers, args)
	t.Logf("%s %s running %s", ControllerManagerBinary, KubernetesVersion, strings.Join(controllers, ","))
}

func (e *Env) startControllerManager(t testing.TB, controllers, extra []string) *proc {
	t.Helper()
	bin := filepath.Join(AssetsDir(), ControllerManagerBinary)
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no %s in %s: run scripts/install-deps.sh (make deps) to build it", ControllerManagerBinary, AssetsDir())
	}
	if e.controllerManager != nil {
		t.Fatal("kube: a kube-controller-manager already runs")
	}
	kc, err := e.WriteKubeconfig(AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--kubeconfig=" + kc,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		// No serving endpoint: readiness is read from the log, so
		// neither a port nor delegated authentication is needed.
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--profiling=false",
	}
	args = append(args, extra...)
	logPath := filepath.Join(e.Dir, ControllerManagerBinary+".log")
	p, err := e.startProc(ControllerManagerBinary, bin, args, logPath)
	if err != nil {
		t.Fatal(err)
	}
	e.controllerManager = p
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of %s's log:\n%s", p.name, p.tail(25))
		}
		p.stop(10 * time.Second)
	})
	return p
}

// waitLogLine polls p's log until it holds line, p exits or timeout
// passes.
func waitLogLine(p *proc, timeout time.Duration, line string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		if b, err := os.ReadFile(p.log); err == nil && strings.Contains(string(b), line) {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it logged %q", p.name, p.err, line)
		case <-ctx.Done():
			return fmt.Errorf("%s did not log %q within %v", p.name, line, timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

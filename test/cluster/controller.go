// Package cluster tests skein's Kubernetes mode as a cluster: real
// skeind processes (--store kubernetes, one per node network namespace,
// each with its own node's credentials), real skein-controller replicas
// on one leader Lease, the real API server of test/kube, pods attached
// through libcni. Its tests break the cluster the ways real clusters
// break — a live node's Node deleted, skeinds and the leader SIGKILLed
// while pods come and go — and check what must never happen: one
// address on two pods, blocks that overlap, a node exporting another
// node's block, records or blocks left behind.
//
// The exported helpers (a controller with flags of the test's choosing,
// per-node identities, reading pods' addresses and nodes' export tables
// from the kernel) serve test/e2e too.
package cluster

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/kubenode"
	"github.com/skeinnet/skein/test/skeintest"
)

// LeaderSeries is the controller's metric that is 1 on the leader.
const LeaderSeries = `leader_election_master_status{name="skein-controller"}`

// Controller is a skein-controller process that can be SIGKILLed and
// started again with the same flags (and ports), as a replica whose pod
// is restarted.
type Controller struct {
	Name    string
	Metrics string // URL of its /metrics
	Log     string // file of its output, every life appended

	args   []string
	health string
	cmd    *exec.Cmd
	done   chan struct{}
}

// StartController runs skein-controller as kubenode.StartController does
// (leader election in kube-system with a 5 s Lease, a 2 s GC sweep, no
// webhook) with extra flags after those (a later flag wins), e.g.
// --node-gc-grace. It waits until the process is healthy, and SIGTERMs
// it at cleanup, showing its log if the test failed.
func StartController(t testing.TB, kubeconfig, name string, extra ...string) *Controller {
	t.Helper()
	metricsAddr := kubenode.LoopbackAddr(t)
	c := &Controller{Name: name, Metrics: "http://" + metricsAddr + "/metrics",
		Log: filepath.Join(t.TempDir(), name+".log"), health: kubenode.LoopbackAddr(t)}
	c.args = append([]string{"--kubeconfig", kubeconfig, "--metrics-addr", metricsAddr, "--health-addr", c.health,
		"--leader-elect-namespace", "kube-system", "--leader-elect-lease-duration", "5s",
		"--leader-elect-renew-deadline", "4s", "--leader-elect-retry-period", "500ms",
		"--gc-interval", "2s", "--webhook-port", "0"}, extra...)
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			b, _ := os.ReadFile(c.Log)
			t.Logf("log of %s:\n%s", name, b)
		}
	})
	c.Start(t)
	return c
}

// Start starts the process (again, after Kill) and waits until it is
// healthy. Call it from the test's goroutine.
func (c *Controller) Start(t testing.TB) {
	t.Helper()
	if c.Running() {
		t.Fatalf("start %s: it is running", c.Name)
	}
	logf, err := os.OpenFile(c.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	c.cmd = exec.Command(filepath.Join(skeintest.Binaries(t), "skein-controller"), c.args...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", c.Name, err)
	}
	done := make(chan struct{})
	c.done = done
	go func(cmd *exec.Cmd) { cmd.Wait(); close(done) }(c.cmd)
	kubenode.Eventually(t, kubenode.Wait, c.Name+" healthy", func() string {
		select {
		case <-done:
			return "exited"
		default:
		}
		resp, err := http.Get("http://" + c.health + "/healthz")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return resp.Status
		}
		return ""
	})
}

// Running reports whether the process has been started and not exited.
func (c *Controller) Running() bool {
	if c.done == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Kill SIGKILLs the process and waits for it to exit.
func (c *Controller) Kill(t testing.TB) {
	t.Helper()
	if !c.Running() {
		t.Fatalf("kill %s: it is not running", c.Name)
	}
	if err := c.cmd.Process.Kill(); err != nil {
		t.Errorf("kill %s: %v", c.Name, err)
	}
	<-c.done
}

// Leading reports whether the controller says it holds the leader Lease
// (false when it cannot be asked: dead, or not serving yet).
func (c *Controller) Leading() bool {
	if !c.Running() {
		return false
	}
	v, err := kubenode.SampleErr(c.Metrics, LeaderSeries)
	return err == nil && v == "1"
}

// stop SIGTERMs a running process, SIGKILLs it after 10 s.
func (c *Controller) stop() {
	if !c.Running() {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// Leader waits until exactly one of cs leads and returns it.
func Leader(t testing.TB, within time.Duration, cs ...*Controller) *Controller {
	t.Helper()
	var leader *Controller
	kubenode.Eventually(t, within, "one controller leading", func() string {
		leader = nil
		n := 0
		for _, c := range cs {
			if c.Leading() {
				leader = c
				n++
			}
		}
		if n != 1 {
			return fmt.Sprintf("%d of %d controllers lead", n, len(cs))
		}
		return ""
	})
	return leader
}

package kube

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// proc is one control-plane process, its output in a log file.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	err  error         // its exit status, valid after done
}

// startProc starts bin with args, stdout and stderr to logPath.
//
// The process gets SIGKILL when the test binary dies (a timeout's panic
// leaves no apiserver behind): Pdeathsig fires when the thread that
// started the child exits, not the process, and tests that enter network
// namespaces retire their locked threads. So the child is started from a
// goroutine that keeps its own locked thread until the child is gone.
func startProc(name, bin string, args []string, logPath string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	p := &proc{name: name, log: logPath, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logf.Close()
		if err := p.cmd.Start(); err != nil {
			started <- fmt.Errorf("start %s: %w", name, err)
			close(p.done)
			return
		}
		started <- nil
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, <-started
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, then SIGKILL after grace, and waits.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail returns the last n lines of the log.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// portConflict reports whether the process died because a port was taken
// after freePort let it go.
func (p *proc) portConflict() bool {
	b, _ := os.ReadFile(p.log)
	return p.exited() && strings.Contains(string(b), "address already in use")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

// startProc is the package's startProc inside the Env's network
// namespace, if it has one.
func (e *Env) startProc(name, bin string, args []string, logPath string) (*proc, error) {
	bin, args = e.command(bin, args)
	return startProc(name, bin, args, logPath)
}

// command returns the program and arguments that run bin with args in
// the Env's network namespace: nsenter, which enters it and execs bin
// (no fork: the process is bin, Pdeathsig and signals included).
func (e *Env) command(bin string, args []string) (string, []string) {
	if e.netns == "" {
		return bin, args
	}
	return "nsenter", append([]string{"--net=" + e.netns, "--", bin}, args...)
}

// DialContext dials addr from the Env's network namespace (from this
// process's own when it has none): the socket is made there, so the
// connection stays in it whatever thread uses it afterwards.
func (e *Env) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if e.netns == "" {
		return d.DialContext(ctx, network, addr)
	}
	target, err := ns.GetNS(e.netns)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	var conn net.Conn
	err = target.Do(func(ns.NetNS) error {
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Process is a long-running program a test started (a kubelet, a
// containerd), its output in a log file, killed when the test binary
// dies (startProc's Pdeathsig).
type Process struct{ p *proc }

// StartProcess starts bin with args, stdout and stderr appended to
// logPath.
func StartProcess(name, bin string, args []string, logPath string) (*Process, error) {
	p, err := startProc(name, bin, args, logPath)
	if err != nil {
		return nil, err
	}
	return &Process{p}, nil
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool { return p.p.exited() }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.p.done }

// Stop sends SIGTERM, then SIGKILL after grace, and waits for the end.
func (p *Process) Stop(grace time.Duration) { p.p.stop(grace) }

// Tail returns the last n lines of the log.
func (p *Process) Tail(n int) string { return p.p.tail(n) }

// Log is the log file's path.
func (p *Process) Log() string { return p.p.log }

// SAKeyFile is the service account signing key (kube-controller-manager's
// --service-account-private-key-file, for the token controller).
func (e *Env) SAKeyFile() string { return filepath.Join(e.Dir, "certs", "sa.key") }

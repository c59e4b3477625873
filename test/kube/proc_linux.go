package kube

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
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

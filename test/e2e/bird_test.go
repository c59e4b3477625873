package e2e

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"text/template"
	"time"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/test/harness"
	"github.com/skeinnet/skein/test/skeintest"
)

// birdConf is the example configuration of export mode (the README
// quotes it), a text/template filled in per node.
const birdConf = "testdata/bird.conf"

// birdNode is what birdConf needs of one node.
type birdNode struct {
	Name         string // of its BGP protocols on the peers
	AS           int
	RouterID     netip.Addr
	Addr4, Addr6 netip.Addr
	Peers        []birdNode
	// Blocks4 and Blocks6 are what a peer may announce: each pool's
	// subnet at its block length, as BIRD's prefix patterns
	// ("10.130.0.0/24{29,29}").
	Blocks4, Blocks6 []string
}

// blockPatterns are pools' BIRD prefix patterns for birdNode.
func blockPatterns(pools ...skeinv1.AddressPool) (v4, v6 []string) {
	for _, p := range pools {
		for _, s := range p.Spec.Subnets {
			if s.IPv4 != nil {
				v4 = append(v4, fmt.Sprintf("%s{%d,%d}", *s.IPv4, 32-p.Spec.BlockSizeBits, 32-p.Spec.BlockSizeBits))
			}
			if s.IPv6 != nil {
				v6 = append(v6, fmt.Sprintf("%s{%d,%d}", *s.IPv6, 128-p.Spec.BlockSizeBits, 128-p.Spec.BlockSizeBits))
			}
		}
	}
	return v4, v6
}

// birdProc is a bird daemon running in a node namespace.
type birdProc struct {
	ctl  string // control socket, for birdc -s
	cmd  *exec.Cmd
	log  *harness.SyncBuffer
	done chan struct{}
}

// startBird writes birdConf for self and runs `bird -f -c CONF -s CTL`
// inside ns. It is SIGTERMed at cleanup (SIGKILLed if it lingers), its
// files removed, its log shown if the test failed.
func startBird(t *testing.T, ns *harness.NS, self birdNode) *birdProc {
	t.Helper()
	bin := skeintest.RequireTool(t, "bird")
	tmpl, err := template.ParseFiles(birdConf)
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: a control socket's path must fit in sun_path.
	dir, err := os.MkdirTemp("", "bird-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf := filepath.Join(dir, "bird.conf")
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, self); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &birdProc{ctl: filepath.Join(dir, "bird.ctl"), log: &harness.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "-f", "-c", conf, "-s", p.ctl)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The child is forked from the thread Do holds in the namespace.
	if err := ns.Do(p.cmd.Start); err != nil {
		t.Fatalf("start bird in %s: %v", ns.Name(), err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		var state string
		if t.Failed() {
			state = p.show("protocols") + p.show("route", "all")
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("bird in %s (%s):\n%s\nconfiguration:\n%s\nstate:\n%s", ns.Name(), self.Name, p.log.String(), buf.String(), state)
		}
	})
	// bird parses its configuration before it opens the socket.
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("bird in %s exited at start:\n%s", ns.Name(), p.log.String())
		default:
		}
		if _, err := os.Stat(p.ctl); err == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("bird in %s made no control socket within 10s:\n%s", ns.Name(), p.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// show runs `birdc -s CTL show ...` (for failure messages).
func (p *birdProc) show(what ...string) string {
	out, err := exec.Command("birdc", append([]string{"-s", p.ctl, "show"}, what...)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("birdc show %v: %v: %s", what, err, out)
	}
	return string(out)
}

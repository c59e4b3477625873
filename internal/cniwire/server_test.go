package cniwire

import (
	"bufio"
	"context"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/skeinnet/skein/internal/cnirun"
)

// flakyListener fails its first Accepts with a temporary error (EMFILE).
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (f *flakyListener) Accept() (net.Conn, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: syscall.EMFILE}
	}
	return f.Listener.Accept()
}

// TestSplitSurvivesTemporaryErrors: running out of file descriptors for a
// moment does not stop skeind serving its socket.
func TestSplitSurvivesTemporaryErrors(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: l}
	fl.fails.Store(3)
	s := NewSplit(fl, func(ctx context.Context, req cnirun.Request) cnirun.Reply {
		return cnirun.Reply{Stdout: append([]byte(req.Service+":"), req.Stdin...)}
	})
	defer s.Close()
	if rep, err := execOn(sock, cnirun.Request{Service: "s", Stdin: []byte("b")}); err != nil || string(rep.Stdout) != "s:b" {
		t.Fatalf("after temporary accept errors: reply %+v, %v", rep, err)
	}
}

// execOn sends req as a CNI binary does and reads the reply.
func execOn(sock string, req cnirun.Request) (cnirun.Reply, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return cnirun.Reply{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(cnirun.AppendRequest(nil, req)); err != nil {
		return cnirun.Reply{}, err
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return cnirun.Reply{}, err
	}
	return cnirun.ParseReply(out)
}

// TestSplitRoutesOthers: a connection that does not open a request goes
// to the other listener with its first bytes; one that sends nothing and
// hangs up goes nowhere.
func TestSplitRoutesOthers(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	s := NewSplit(l, func(context.Context, cnirun.Request) cnirun.Reply { calls.Add(1); return cnirun.Reply{} })
	defer s.Close()
	other := s.Listener()

	empty, _ := net.Dial("unix", sock)
	empty.Close()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	c.Write([]byte(preface))
	got, err := other.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	buf := make([]byte, len(preface))
	got.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(got, buf); err != nil || string(buf) != preface {
		t.Fatalf("the other server read %q, %v; want the preface whole", buf, err)
	}
	if calls.Load() != 0 {
		t.Error("the handler ran for a connection that was not a request")
	}
	s.Close()
	if _, err := other.Accept(); err == nil {
		t.Error("Accept after Close succeeded")
	}
}

// TestSplitRunsExecs: a CNI binary's whole exec (package cnirun) goes to
// the run handler with the call's deadline, and its answer comes back in
// one reply.
func TestSplitRunsExecs(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := NewSplit(l, func(ctx context.Context, req cnirun.Request) cnirun.Reply {
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) > 3*time.Second {
			t.Errorf("deadline %v %v, want the request's 3 s", dl, ok)
		}
		return cnirun.Reply{Exit: 2, Stdout: append([]byte(req.Service+":"), req.Stdin...)}
	})
	defer s.Close()
	rep, err := execOn(sock, cnirun.Request{TimeoutMS: 3000, Service: "svc", Stdin: []byte("in")})
	if err != nil || rep.Exit != 2 || string(rep.Stdout) != "svc:in" {
		t.Fatalf("reply %+v, %v", rep, err)
	}
}

// TestSplitRoute: a connection that opens with a route's magic goes to
// the route, the bytes after the magic in its reader; CNI execs and
// others go where they did.
func TestSplitRoute(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	s := NewSplit(l, func(ctx context.Context, req cnirun.Request) cnirun.Reply {
		return cnirun.Reply{Stdout: []byte("cni")}
	}, Route{Magic: "ROUTE-TEST/1", Serve: func(c net.Conn, r *bufio.Reader) {
		defer c.Close()
		b, _ := io.ReadAll(r)
		got <- string(b)
	}})
	defer s.Close()
	go func() {
		c, err := s.Listener().Accept()
		if err == nil {
			got <- "other"
			c.Close()
		}
	}()

	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("ROUTE-TEST/1 and the rest"))
	c.(*net.UnixConn).CloseWrite()
	if g := <-got; g != " and the rest" {
		t.Errorf("the route got %q, want the bytes after its magic", g)
	}
	c.Close()
	if rep, err := execOn(sock, cnirun.Request{Service: "s"}); err != nil || string(rep.Stdout) != "cni" {
		t.Errorf("a CNI exec beside the route: %+v %v", rep, err)
	}
	c, err = net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("PRI * HTTP/2.0\r\n"))
	if g := <-got; g != "other" {
		t.Errorf("a gRPC connection went to %q", g)
	}
}

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
	s := NewSplit(fl, func(ctx context.Context, method string, body []byte) Reply {
		return Reply{Body: append([]byte(method+":"), body...)}
	})
	defer s.Close()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(AppendRequest(nil, Request{Method: "/s/M", Body: []byte("b")})); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if err := ReadAck(br); err != nil {
		t.Fatalf("no acknowledgement after temporary accept errors: %v", err)
	}
	rep, err := ReadReply(br)
	if err != nil || string(rep.Body) != "/s/M:b" {
		t.Fatalf("reply %+v, %v", rep, err)
	}
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
	s := NewSplit(l, func(context.Context, string, []byte) Reply { calls.Add(1); return Reply{} })
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

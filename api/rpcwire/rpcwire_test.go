package rpcwire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/skeinnet/skein/api/rpc"
)

// pods is a Pods service for the tests: Attach echoes the request into
// a status, waits for hold to close when the pod's ID is "hold", and
// fails as the ID asks otherwise.
type pods struct {
	rpc.UnimplementedPodsServer
	hold    chan struct{}
	started chan struct{}
	ended   chan error    // the context's error when a held call returned
	quit    chan struct{} // closed when the test ends: held calls fail
}

func (p *pods) Attach(ctx context.Context, in *rpc.PodAttachRequest) (*rpc.PodStatus, error) {
	switch in.Id {
	case "hold":
		p.started <- struct{}{}
		select {
		case <-p.hold:
			p.ended <- nil
		case <-ctx.Done():
			p.ended <- ctx.Err()
			return nil, ctx.Err()
		case <-p.quit:
			return nil, status.Error(codes.Aborted, "the test ended")
		}
	case "fail":
		st, _ := status.New(codes.FailedPrecondition, "network \"x\" is not allowed").
			WithDetails(&errdetails.ErrorInfo{Reason: "DENIED", Domain: "skein.dev"})
		return nil, st.Err()
	case "plain":
		return nil, errors.New("a plain error")
	case "panic":
		var none []int
		return &rpc.PodStatus{Id: fmt.Sprint(none[0])}, nil
	case "big":
		// A reply larger than a socket's buffers.
		return &rpc.PodStatus{Id: in.Id, Netns: strings.Repeat("x", 4<<20)}, nil
	}
	out := &rpc.PodStatus{Id: in.Id, Netns: in.Netns}
	for _, n := range in.Networks {
		out.Attachments = append(out.Attachments, &rpc.PodAttachment{Network: n.Network, Ifname: n.Ifname, State: "attached"})
	}
	return out, nil
}

// serve starts a Server for a fresh pods on a socket, with the accept
// loop skeind's socket split runs (Magic first), counting connections.
type served struct {
	srv     *Server
	pods    *pods
	sock    string
	l       net.Listener
	accepts atomic.Int32
	wg      sync.WaitGroup
	once    sync.Once
}

func serve(t *testing.T, sock string) *served {
	t.Helper()
	if sock == "" {
		sock = filepath.Join(t.TempDir(), "s.sock")
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := &served{srv: NewServer(), sock: sock, l: l,
		pods: &pods{hold: make(chan struct{}), started: make(chan struct{}, 8), ended: make(chan error, 8), quit: make(chan struct{})}}
	rpc.RegisterPodsServer(s.srv, s.pods)
	s.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.accepts.Add(1)
			s.wg.Go(func() {
				r := bufio.NewReader(c)
				m, err := r.Peek(len(Magic))
				if err != nil || string(m) != Magic {
					c.Close()
					return
				}
				r.Discard(len(Magic))
				s.srv.Serve(c, r)
			})
		}
	})
	t.Cleanup(s.stop)
	return s
}

func (s *served) stop() {
	s.once.Do(func() { close(s.pods.quit) })
	s.l.Close()
	s.srv.Close()
	s.srv.Wait()
	s.wg.Wait()
}

// dial returns a Conn to sock, closed when the test ends, and a Pods
// client on it.
func dial(t *testing.T, sock string) (*Conn, rpc.PodsClient) {
	conn := Dial(sock)
	t.Cleanup(func() { conn.Close() })
	return conn, rpc.NewPodsClient(conn)
}

func attach(ctx context.Context, c rpc.PodsClient, id string) (*rpc.PodStatus, error) {
	return c.Attach(ctx, &rpc.PodAttachRequest{Id: id, Netns: "/run/netns/" + id,
		Networks: []*rpc.PodNetwork{{Network: "a", Ifname: "eth0"}, {Network: "b", Ifname: "net1"}}})
}

func TestCall(t *testing.T) {
	s := serve(t, "")
	_, c := dial(t, s.sock)
	for i := range 50 {
		id := fmt.Sprintf("pod-%d", i)
		got, err := attach(context.Background(), c, id)
		if err != nil {
			t.Fatal(err)
		}
		want := &rpc.PodStatus{Id: id, Netns: "/run/netns/" + id, Attachments: []*rpc.PodAttachment{
			{Network: "a", Ifname: "eth0", State: "attached"}, {Network: "b", Ifname: "net1", State: "attached"}}}
		if !proto.Equal(got, want) {
			t.Fatalf("call %d: got %v, want %v", i, got, want)
		}
	}
	if n := s.accepts.Load(); n != 1 {
		t.Errorf("50 calls in turn took %d connections, want 1", n)
	}
}

func TestErrors(t *testing.T) {
	s := serve(t, "")
	conn, c := dial(t, s.sock)

	_, err := attach(context.Background(), c, "fail")
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != `network "x" is not allowed` {
		t.Errorf("status: got %v %q", st.Code(), st.Message())
	}
	if d := st.Details(); len(d) != 1 || d[0].(*errdetails.ErrorInfo).Reason != "DENIED" {
		t.Errorf("details: got %v", d)
	}
	if _, err := attach(context.Background(), c, "plain"); status.Code(err) != codes.Unknown || status.Convert(err).Message() != "a plain error" {
		t.Errorf("a plain error: got %v", err)
	}
	if _, err := c.Detach(context.Background(), &rpc.PodRef{Id: "x"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("unimplemented method: got %v", err)
	}
	if err := conn.Invoke(context.Background(), "/skein.v1.Nope/Call", &rpc.Empty{}, &rpc.Empty{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: got %v", err)
	}
	// A method that panics (a bug) fails its call alone, as Internal.
	if _, err := attach(context.Background(), c, "panic"); status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "index out of range") {
		t.Errorf("a panicking method: got %v", err)
	}
	// Errors leave the connection usable.
	if _, err := attach(context.Background(), c, "ok"); err != nil {
		t.Fatal(err)
	}
	if n := s.accepts.Load(); n != 1 {
		t.Errorf("calls took %d connections, want 1", n)
	}
}

func TestDeadline(t *testing.T) {
	s := serve(t, "")
	_, c := dial(t, s.sock)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := attach(ctx, c, "hold")
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	<-s.pods.started
	select {
	case err := <-s.pods.ended:
		if err == nil {
			t.Fatal("the held call was let go, not ended by its context")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server's call went on after the client's deadline")
	}
	if _, err := attach(context.Background(), c, "ok"); err != nil {
		t.Fatalf("after a deadline: %v", err)
	}
}

// A client that gives up (no deadline: a cancel) hangs up, and the
// server's call is canceled.
func TestCancelReachesServer(t *testing.T) {
	s := serve(t, "")
	_, c := dial(t, s.sock)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := attach(ctx, c, "hold"); errc <- err }()
	<-s.pods.started
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("client: got %v, want Canceled", err)
	}
	select {
	case err := <-s.pods.ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("server's call ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server's call was not canceled when the client hung up")
	}
}

// A held call completes normally when let go; its context is not
// canceled by the reader that watches for a hang-up.
func TestHeldCallCompletes(t *testing.T) {
	s := serve(t, "")
	_, c := dial(t, s.sock)
	errc := make(chan error, 1)
	go func() { _, err := attach(context.Background(), c, "hold"); errc <- err }()
	<-s.pods.started
	time.Sleep(50 * time.Millisecond)
	close(s.pods.hold)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := <-s.pods.ended; err != nil {
		t.Fatalf("the held call's context ended: %v", err)
	}
}

// Concurrent calls, successes and failures mixed: each gets its own
// answer (a failure's status is decoded before its connection is reused).
func TestConcurrent(t *testing.T) {
	s := serve(t, "")
	conn, c := dial(t, s.sock)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 40 {
				if (g+i)%2 == 0 {
					_, err := attach(context.Background(), c, "fail")
					if st := status.Convert(err); st.Code() != codes.FailedPrecondition || len(st.Details()) != 1 {
						t.Errorf("a failing call: got %v (%d details)", err, len(st.Details()))
						return
					}
					continue
				}
				id := fmt.Sprintf("g%d-%d", g, i)
				got, err := attach(context.Background(), c, id)
				if err != nil {
					t.Error(err)
					return
				}
				if got.Id != id {
					t.Errorf("asked for %s, got %s", id, got.Id)
				}
			}
		})
	}
	wg.Wait()
	if n := s.accepts.Load(); n < 1 || n > 16 {
		t.Errorf("16 callers took %d connections, want 1 to 16", n)
	}
	conn.mu.Lock()
	idle := len(conn.idle)
	conn.mu.Unlock()
	if idle > maxIdle {
		t.Errorf("%d idle connections kept, want at most %d", idle, maxIdle)
	}
}

// A server restarted on the same socket: the idle connections the client
// kept are dead, and the call goes on a new one.
func TestRestartedServer(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	s := serve(t, sock)
	conn, c := dial(t, sock)
	// Three calls at once leave three idle connections.
	errc := make(chan error, 3)
	for range 3 {
		go func() { _, err := attach(context.Background(), c, "hold"); errc <- err }()
	}
	for range 3 {
		<-s.pods.started
	}
	close(s.pods.hold)
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if n := len(conn.idle); n != 3 {
		t.Fatalf("%d idle connections, want 3", n)
	}
	s.stop()
	s2 := serve(t, sock)
	if _, err := attach(context.Background(), c, "two"); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if n := s2.accepts.Load(); n != 1 {
		t.Errorf("the new server took %d connections, want 1", n)
	}
}

// A server that is not this protocol's (skeind before it: gRPC alone on
// the socket) is detected and the Conn falls back to gRPC.
func TestFallBackToGRPC(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "g.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	rpc.RegisterPodsServer(g, &pods{})
	go g.Serve(l)
	defer g.Stop()
	conn, c := dial(t, sock)
	for _, id := range []string{"one", "two"} {
		got, err := attach(context.Background(), c, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Id != id {
			t.Errorf("got %s, want %s", got.Id, id)
		}
	}
	if _, err := attach(context.Background(), c, "fail"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("an error over the fallback: %v", err)
	}
	if conn.legacyConn() == nil {
		t.Error("the Conn did not fall back")
	}
}

// Malformed and oversized frames end the connection without a call.
func TestBadFrames(t *testing.T) {
	s := serve(t, "")
	frame := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint32([]byte(Magic), uint32(len(body))), body...)
	}
	for name, b := range map[string][]byte{
		"short":        frame([]byte{0, 0}),
		"empty method": frame([]byte{0, 0, 0, 0, 0, 0}),
		"method past":  frame([]byte{0, 0, 0, 0, 0, 9, 'x'}),
		"oversized":    binary.BigEndian.AppendUint32([]byte(Magic), MaxRequest+1),
		"bad message":  frame(append([]byte{0, 0, 0, 0, 0, 21}, append([]byte("/skein.v1.Pods/Attach"), 0xff, 0xff)...)),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("unix", s.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
			if name == "bad message" {
				// A message that does not decode is the method's error;
				// the connection stays.
				r := bufio.NewReader(c)
				m := make([]byte, len(Magic))
				if _, err := io.ReadFull(r, m); err != nil || string(m) != Magic {
					t.Fatalf("got %q (%v)", m, err)
				}
				body, err := readFrame(r, nil, MaxReply)
				if err != nil {
					t.Fatal(err)
				}
				st, _, err := parseReply(body)
				var sp spb.Status
				if err != nil || proto.Unmarshal(st, &sp) != nil || codes.Code(sp.Code) != codes.Internal {
					t.Fatalf("want an Internal status, got %q (%v)", body, err)
				}
				return
			}
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if len(got) != 0 {
				t.Errorf("got a reply %q", got)
			}
		})
	}
}

// A client that asks for a large reply and stops reading: Abort frees the
// server (Wait returns) rather than leave its write blocked.
func TestAbortFreesStuckReply(t *testing.T) {
	s := serve(t, "")
	c, err := net.Dial("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg, _ := proto.Marshal(&rpc.PodAttachRequest{Id: "big"})
	if _, err := c.Write(appendRequest([]byte(Magic), 0, "/skein.v1.Pods/Attach", msg)); err != nil {
		t.Fatal(err)
	}
	// Wait until the server is busy with it, then stop it.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.srv.mu.Lock()
		busy := false
		for sc := range s.srv.conns {
			busy = busy || sc.busy
		}
		s.srv.mu.Unlock()
		if busy {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the server never took the call")
		}
	}
	time.Sleep(50 * time.Millisecond)
	s.srv.Close()
	s.srv.Abort()
	waited := make(chan struct{})
	go func() { s.srv.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still blocked 5 s after Abort: a reply no one reads holds the server")
	}
}

// Close answers the calls in flight, closes the idle connections and
// takes no new call.
func TestServerClose(t *testing.T) {
	s := serve(t, "")
	_, c := dial(t, s.sock)
	if _, err := attach(context.Background(), c, "warm"); err != nil {
		t.Fatal(err)
	}
	conn2 := Dial(s.sock)
	defer conn2.Close()
	errc := make(chan error, 1)
	go func() { _, err := attach(context.Background(), rpc.NewPodsClient(conn2), "hold"); errc <- err }()
	<-s.pods.started
	s.l.Close()
	s.srv.Close()
	waited := make(chan struct{})
	go func() { s.srv.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned with a call in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(s.pods.hold)
	if err := <-errc; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	<-waited
	if _, err := attach(context.Background(), c, "late"); status.Code(err) != codes.Unavailable {
		t.Errorf("a call after Close: got %v, want Unavailable", err)
	}
}

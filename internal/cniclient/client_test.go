package cniclient

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cniwire"
	"github.com/skeinnet/skein/internal/cniwire/wireserver"
)

// fake is a CNI service on the real grpc-go server.
type fake struct {
	rpc.UnimplementedCNIServer
	got   chan *rpc.CNIRequest
	reply *rpc.CNIReply
	err   error
	delay time.Duration
}

func (f *fake) Add(ctx context.Context, r *rpc.CNIRequest) (*rpc.CNIReply, error) {
	f.got <- r
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return f.reply, f.err
}

// listenUnix listens on a socket in a directory of the test's own and
// closes it when the test ends.
func listenUnix(t testing.TB) (net.Listener, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, sock
}

// serve is f on a gRPC server alone: a skeind from before the short path
// (the client falls back to gRPC).
func serve(t *testing.T, f *fake) string {
	t.Helper()
	l, sock := listenUnix(t)
	s := grpc.NewServer()
	rpc.RegisterCNIServer(s, f)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return sock
}

// skeindServer is f served as skeind serves its CNI service: the short
// path and gRPC on one socket. wire counts the calls that came over the
// short path.
type skeindServer struct {
	sock  string
	split *cniwire.Split
	wire  atomic.Int64
}

func serveSkeind(t *testing.T, f *fake) *skeindServer {
	t.Helper()
	l, sock := listenUnix(t)
	ss := &skeindServer{sock: sock}
	h := wireserver.Handler(map[string]rpc.CNIMethods{rpc.CNI_ServiceDesc.ServiceName: f})
	ss.split = cniwire.NewSplit(l, func(ctx context.Context, method string, body []byte) cniwire.Reply {
		ss.wire.Add(1)
		return h(ctx, method, body)
	})
	s := grpc.NewServer()
	rpc.RegisterCNIServer(s, f)
	go s.Serve(ss.split.Listener())
	t.Cleanup(func() { s.Stop(); ss.split.Close() })
	return ss
}

// bothServers runs f against an older skeind (gRPC only: the call falls
// back) and against skeind's short path, checking the path each call took.
func bothServers(t *testing.T, f func(t *testing.T, sock string, fk *fake)) {
	t.Run("grpc only", func(t *testing.T) {
		fk := &fake{got: make(chan *rpc.CNIRequest, 1)}
		f(t, serve(t, fk), fk)
	})
	t.Run("short path", func(t *testing.T) {
		fk := &fake{got: make(chan *rpc.CNIRequest, 1)}
		ss := serveSkeind(t, fk)
		f(t, ss.sock, fk)
		if ss.wire.Load() == 0 {
			t.Error("no call came over the short path")
		}
	})
}

func TestRoundTripAgainstGRPCGo(t *testing.T) {
	big := bytes.Repeat([]byte(`{"k":"v"}`), 20000) // spans many HTTP/2 frames
	cases := []struct {
		name  string
		req   Request
		reply *rpc.CNIReply
	}{
		{"result", Request{ContainerID: "c1", NetNS: "/run/netns/p", IfName: "eth0", Args: "IP=10.0.0.1", Path: "/opt/cni/bin", NetConf: []byte(`{"name":"n"}`)},
			&rpc.CNIReply{Result: []byte(`{"cniVersion":"1.1.0"}`)}},
		{"cni error", Request{ContainerID: "c2", IfName: "eth0"},
			&rpc.CNIReply{Error: &rpc.CNIError{Code: 102, Msg: "exists", Details: "net/c2/eth0"}}},
		{"empty reply", Request{}, &rpc.CNIReply{}},
		{"large config", Request{ContainerID: "c3", NetConf: big}, &rpc.CNIReply{Result: big}},
	}
	for _, c := range cases {
		bothServers(t, func(t *testing.T, sock string, f *fake) {
			f.reply = c.reply
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			rep, err := Call(ctx, sock, "Add", c.req)
			if err != nil {
				t.Fatal(err)
			}
			got := <-f.got
			want := &rpc.CNIRequest{ContainerId: c.req.ContainerID, Netns: c.req.NetNS, Ifname: c.req.IfName, Args: c.req.Args, Path: c.req.Path, Netconf: c.req.NetConf}
			if !proto.Equal(got, want) {
				t.Errorf("server got %v, want %v", got, want)
			}
			if !bytes.Equal(rep.Result, c.reply.Result) {
				t.Errorf("result %q, want %q", trunc(rep.Result), trunc(c.reply.Result))
			}
			if (rep.Error == nil) != (c.reply.Error == nil) {
				t.Fatalf("error %v, want %v", rep.Error, c.reply.Error)
			}
			if e := c.reply.Error; e != nil && (rep.Error.Code != e.Code || rep.Error.Msg != e.Msg || rep.Error.Details != e.Details) {
				t.Errorf("error %+v, want %v", rep.Error, e)
			}
		})
	}
}

func trunc(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

func TestEncodingMatchesProto(t *testing.T) {
	r := Request{ContainerID: "x", NetNS: "/n", IfName: "eth1", Args: "a=b", Path: "/p", NetConf: []byte("{}")}
	var m rpc.CNIRequest
	if err := proto.Unmarshal(encodeRequest(r), &m); err != nil {
		t.Fatal(err)
	}
	if m.ContainerId != "x" || m.Netns != "/n" || m.Ifname != "eth1" || m.Args != "a=b" || m.Path != "/p" || string(m.Netconf) != "{}" {
		t.Errorf("decoded %v", &m)
	}
	b, _ := proto.Marshal(&rpc.CNIReply{Result: []byte("r"), Error: &rpc.CNIError{Code: 7, Msg: "m", Details: "d"}})
	rep, err := decodeReply(b)
	if err != nil || string(rep.Result) != "r" || rep.Error.Code != 7 || rep.Error.Msg != "m" || rep.Error.Details != "d" {
		t.Errorf("decodeReply = %+v %+v, %v", rep, rep.Error, err)
	}
	if _, err := decodeReply([]byte{0x0a, 0x05, 'x'}); err == nil {
		t.Error("truncated reply accepted")
	}
}

func TestStatusErrors(t *testing.T) {
	bothServers(t, func(t *testing.T, sock string, f *fake) {
		f.err = status.Error(codes.FailedPrecondition, "pool \"p\": 100% used")
		_, err := Call(context.Background(), sock, "Add", Request{})
		var se *StatusError
		if !errors.As(err, &se) || se.Code != int(codes.FailedPrecondition) || se.Message != `pool "p": 100% used` {
			t.Fatalf("err = %v, want FailedPrecondition with the message", err)
		}

		_, err = Call(context.Background(), sock, "NoSuchMethod", Request{})
		if !errors.As(err, &se) || se.Code != int(codes.Unimplemented) {
			t.Fatalf("unknown method: err = %v, want Unimplemented", err)
		}
	})
}

func TestUnavailableAndDeadline(t *testing.T) {
	_, err := Call(context.Background(), filepath.Join(t.TempDir(), "none.sock"), "Add", Request{})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing socket: err = %v, want ErrUnavailable", err)
	}
	bothServers(t, func(t *testing.T, sock string, f *fake) {
		f.reply, f.delay = &rpc.CNIReply{}, 2*time.Second
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = Call(ctx, sock, "Add", Request{})
		var se *StatusError
		if !errors.As(err, &se) || se.Code != CodeDeadlineExceeded {
			t.Fatalf("err = %v, want DeadlineExceeded", err)
		}
		if time.Since(start) > time.Second {
			t.Errorf("deadline not honoured: took %v", time.Since(start))
		}
		if !strings.Contains(err.Error(), "deadline") {
			t.Errorf("message %q does not say deadline", err)
		}
	})
}

// TestMisbehavingServer: a peer that is not a gRPC server, or that hangs up,
// gives an error promptly, never a hang or a panic.
func TestMisbehavingServer(t *testing.T) {
	cases := map[string]func(c net.Conn){
		"hangs up":        func(c net.Conn) { c.Close() },
		"garbage":         func(c net.Conn) { c.Write(bytes.Repeat([]byte{0xff}, 64)); c.Close() },
		"huge frame":      func(c net.Conn) { c.Write([]byte{0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1}); c.Close() },
		"bad padding":     func(c net.Conn) { c.Write([]byte{0, 0, 1, 1, 0x8 | 0x4, 0, 0, 0, 1, 9}); c.Close() },
		"http 503":        func(c net.Conn) { c.Write(append([]byte{0, 0, 1, 1, 0x4, 0, 0, 0, 1}, 0x8d)) }, // :status 503 (static index 13)
		"reset by server": func(c net.Conn) { c.Write([]byte{0, 0, 4, 3, 0, 0, 0, 0, 1, 0, 0, 0, 2}); c.Close() },
	}
	for name, behave := range cases {
		t.Run(name, func(t *testing.T) {
			l, sock := listenUnix(t)
			// Every connection: the short path's, then gRPC's (the
			// client falls back when nothing acknowledged its request).
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					buf := make([]byte, 4096)
					c.Read(buf) // the preface and the request
					behave(c)
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			_, err := Call(ctx, sock, "Add", Request{ContainerID: "x"})
			if err == nil {
				t.Fatal("Call succeeded against a misbehaving server")
			}
			if time.Since(start) > 2*time.Second {
				t.Errorf("took %v to fail: %v", time.Since(start), err)
			}
		})
	}
}

// TestGracefulStopMidCall: a server that stops gracefully while our call is
// in flight (skeind on SIGTERM) announces GOAWAY first and still answers;
// the call must succeed rather than report a failure for work that is done.
func TestGracefulStopMidCall(t *testing.T) {
	f := &fake{got: make(chan *rpc.CNIRequest, 1), reply: &rpc.CNIReply{Result: []byte("done")}, delay: 300 * time.Millisecond}
	l, sock := listenUnix(t)
	s := grpc.NewServer()
	rpc.RegisterCNIServer(s, f)
	go s.Serve(l)
	go func() {
		<-f.got
		time.Sleep(50 * time.Millisecond)
		s.GracefulStop()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := Call(ctx, sock, "Add", Request{ContainerID: "g"})
	if err != nil {
		t.Fatalf("call during a graceful stop: %v, want the server's answer", err)
	}
	if string(rep.Result) != "done" {
		t.Errorf("result %q", rep.Result)
	}
}

// TestShortPathNoRetry: once skeind has acknowledged a request, a
// connection lost before the reply is an error, never a second try over
// gRPC (the request may have run). Before the acknowledgement, nothing ran
// and the call goes over gRPC.
func TestShortPathNoRetry(t *testing.T) {
	for name, c := range map[string]struct {
		behave func(c net.Conn)
		conns  int
	}{
		"acknowledged, then hung up": {func(c net.Conn) { c.Write([]byte(cniwire.AckMagic)); c.Close() }, 1},
		"acknowledged, half a reply": {func(c net.Conn) { c.Write([]byte(cniwire.AckMagic + "\x00\x00")); c.Close() }, 1},
		"hung up at once":            {func(c net.Conn) { c.Close() }, 2},
	} {
		t.Run(name, func(t *testing.T) {
			l, sock := listenUnix(t)
			var conns atomic.Int64
			go func() {
				for {
					cn, err := l.Accept()
					if err != nil {
						return
					}
					conns.Add(1)
					cn.Read(make([]byte, 4096))
					c.behave(cn)
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if _, err := Call(ctx, sock, "Add", Request{ContainerID: "x"}); err == nil {
				t.Fatal("call succeeded")
			}
			if n := conns.Load(); n != int64(c.conns) {
				t.Errorf("%d connections, want %d", n, c.conns)
			}
		})
	}
}

// TestShortPathStopMidCall: skeind closing its socket (SIGTERM) while a
// short-path call runs still answers that call.
func TestShortPathStopMidCall(t *testing.T) {
	f := &fake{got: make(chan *rpc.CNIRequest, 1), reply: &rpc.CNIReply{Result: []byte("done")}, delay: 300 * time.Millisecond}
	ss := serveSkeind(t, f)
	go func() {
		<-f.got
		ss.split.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := Call(ctx, ss.sock, "Add", Request{ContainerID: "g"})
	if err != nil || string(rep.Result) != "done" {
		t.Fatalf("call during a stop: %v, %v; want the server's answer", rep, err)
	}
	ss.split.Wait()
	if _, err := Call(ctx, ss.sock, "Add", Request{}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("call after the stop: %v, want ErrUnavailable", err)
	}
}

// TestSplitServesGRPC: on skeind's socket, a gRPC client (skeinctl, an
// older CNI binary) is served by the gRPC server, its first bytes replayed
// to it; none of its calls goes to the short path.
func TestSplitServesGRPC(t *testing.T) {
	f := &fake{got: make(chan *rpc.CNIRequest, 1), reply: &rpc.CNIReply{Result: []byte("r")}}
	ss := serveSkeind(t, f)
	conn, err := grpc.NewClient("unix://"+ss.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := rpc.NewCNIClient(conn).Add(ctx, &rpc.CNIRequest{ContainerId: "grpc"})
	if err != nil || string(rep.Result) != "r" {
		t.Fatalf("gRPC call through the split: %v, %v", rep, err)
	}
	if got := <-f.got; got.ContainerId != "grpc" {
		t.Errorf("server got %v", got)
	}
	// The HTTP/2 client of this package, on its own, too.
	if rep, err := callGRPC(ctx, ss.sock, "/skein.v1.CNI/Add", encodeRequest(Request{ContainerID: "h2"})); err != nil || string(rep.Result) != "r" {
		t.Fatalf("callGRPC through the split: %v, %v", rep, err)
	}
	<-f.got
	if n := ss.wire.Load(); n != 0 {
		t.Errorf("%d gRPC calls went to the short path", n)
	}
}

package rpcwire

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	// IdleTimeout is how long a server keeps a connection that carries
	// no call; a client reuses one for less (clientIdle).
	IdleTimeout = 5 * time.Minute
	// replyTimeout bounds writing a reply to a client that does not read.
	replyTimeout = time.Minute
	// keepBuffer is the largest buffer a connection keeps between calls.
	keepBuffer = 1 << 20
)

// Server serves the unary methods of the services registered on it
// (register each on the gRPC server too: it is a grpc.ServiceRegistrar).
// Its owner accepts the connections and hands each to Serve once it has
// read the client's Magic.
type Server struct {
	methods map[string]method

	base   context.Context // ends calls in flight on Abort
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[*serverConn]struct{}
	closed bool
	calls  sync.WaitGroup
}

type method struct {
	impl    any
	handler grpc.MethodHandler
}

type serverConn struct {
	c    net.Conn
	busy bool // running a call: Close leaves it until the reply is out
}

// NewServer returns a server with no services.
func NewServer() *Server {
	s := &Server{methods: map[string]method{}, conns: map[*serverConn]struct{}{}}
	s.base, s.cancel = context.WithCancel(context.Background())
	return s
}

// RegisterService serves desc's unary methods, run on impl as a gRPC
// server would run them. Call it before serving.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = method{impl: impl, handler: m.Handler}
	}
}

// Serve serves the calls of c, whose Magic was read already (r holds
// what was read beyond it), until the client closes it, sends a
// malformed frame, or the server closes. It closes c.
func (s *Server) Serve(c net.Conn, r *bufio.Reader) {
	sc := &serverConn{c: c}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.conns[sc] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		c.Close()
	}()
	var in, out []byte
	greeted := false
	for {
		c.SetReadDeadline(time.Now().Add(IdleTimeout))
		var err error
		in, err = readFrame(r, in, MaxRequest)
		if err != nil {
			return
		}
		req, err := parseRequest(in)
		if err != nil {
			return
		}
		c.SetReadDeadline(time.Time{})
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		sc.busy = true
		s.calls.Add(1)
		s.mu.Unlock()

		out = out[:0]
		if !greeted {
			out = append(out, Magic...)
			greeted = true
		}
		var ok bool
		out, ok = s.call(c, r, req, out)
		if ok {
			c.SetWriteDeadline(time.Now().Add(replyTimeout))
			_, err = c.Write(out)
		}
		s.mu.Lock()
		sc.busy = false
		closed := s.closed
		s.mu.Unlock()
		s.calls.Done()
		if !ok || err != nil || closed {
			return
		}
		if cap(in) > keepBuffer {
			in = nil
		}
		if cap(out) > keepBuffer {
			out = nil
		}
	}
}

// call runs one request and appends its reply to out. While the method
// runs, a reader waits for the client to hang up (a client that gives up
// closes the connection) and cancels the call's context; ok is false
// when it did, or sent bytes it may not send before the reply.
func (s *Server) call(c net.Conn, r *bufio.Reader, req request, out []byte) (_ []byte, ok bool) {
	ctx, cancel := context.WithCancel(s.base)
	defer cancel()
	if req.timeoutMS > 0 {
		var cancelT context.CancelFunc
		ctx, cancelT = context.WithTimeout(ctx, time.Duration(req.timeoutMS)*time.Millisecond)
		defer cancelT()
	}
	if r.Buffered() > 0 {
		return out, false // a second request before the first's reply
	}
	hungUp := make(chan bool, 1)
	go func() {
		var b [1]byte
		_, err := c.Read(b[:])
		var ne net.Error
		stopped := errors.As(err, &ne) && ne.Timeout()
		if !stopped {
			cancel()
		}
		hungUp <- !stopped
	}()

	resp, err := s.run(ctx, req)

	c.SetReadDeadline(time.Unix(1, 0)) // stop the reader
	if <-hungUp {
		return out, false
	}
	c.SetReadDeadline(time.Time{})

	var st, msg []byte
	if err == nil {
		m, ok := resp.(proto.Message)
		if !ok {
			err = status.Errorf(codes.Internal, "rpcwire: %s answered a %T, not a protobuf message", req.method, resp)
		} else if msg, err = proto.Marshal(m); err != nil {
			err = status.Errorf(codes.Internal, "rpcwire: marshal the reply of %s: %v", req.method, err)
		} else if len(msg)+64 > MaxReply {
			err = status.Errorf(codes.ResourceExhausted, "rpcwire: the reply of %s is %d bytes, over the limit of %d", req.method, len(msg), MaxReply)
		}
	}
	if err != nil {
		msg = nil
		st, _ = proto.Marshal(statusOf(err).Proto())
	}
	return appendReply(out, st, msg), true
}

// run calls the method, decoding the message into what its handler asks.
// A panic in it (a bug) fails this call alone, as Internal.
func (s *Server) run(ctx context.Context, req request) (_ any, err error) {
	defer func() {
		if p := recover(); p != nil {
			slog.Error("a call panicked (a bug: please report it)", "method", req.method, "panic", p, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "skeind failed this call on a bug (its log has the details): %v", p)
		}
	}()
	m, ok := s.methods[req.method]
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "unknown method %s", req.method)
	}
	dec := func(v any) error {
		pm, ok := v.(proto.Message)
		if !ok {
			return status.Errorf(codes.Internal, "rpcwire: %s takes a %T, not a protobuf message", req.method, v)
		}
		if err := proto.Unmarshal(req.msg, pm); err != nil {
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return nil
	}
	return m.handler(m.impl, ctx, dec, nil)
}

// statusOf is err as gRPC's server sends it: a status as is, a context's
// own error as Canceled or DeadlineExceeded, anything else as Unknown.
func statusOf(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// Close stops serving: idle connections are closed at once, busy ones
// once their reply is out. Calls in flight go on (Wait waits for them).
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for sc := range s.conns {
		if !sc.busy {
			sc.c.Close()
		}
	}
}

// Abort cancels the calls in flight and closes every connection, so that
// no reply is left waiting for a client that does not read.
func (s *Server) Abort() {
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	for sc := range s.conns {
		sc.c.Close()
	}
}

// Wait waits for the calls in flight.
func (s *Server) Wait() { s.calls.Wait() }

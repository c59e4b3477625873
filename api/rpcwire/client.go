package rpcwire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"syscall"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	// maxIdle is how many idle connections a Conn keeps.
	maxIdle = 8
	// clientIdle is how long a Conn reuses an idle connection: well
	// inside the server's IdleTimeout, so a reused connection was not
	// closed by it.
	clientIdle = time.Minute
)

// Conn is a client of skeind's socket. It dials a connection per call in
// flight and keeps the idle ones for the next calls. It is safe for
// concurrent use.
type Conn struct {
	socket string

	mu     sync.Mutex
	idle   []*clientConn
	legacy *grpc.ClientConn // once a server did not speak this protocol
	closed bool
}

type clientConn struct {
	c       net.Conn
	r       *bufio.Reader
	greeted bool      // the server's Magic was read
	used    time.Time // when it went idle
	broken  bool      // its context ended mid-call: not to be reused
	buf     []byte
}

// Dial returns a client of the skeind serving socket. It connects on the
// first call.
func Dial(socket string) *Conn { return &Conn{socket: socket} }

var _ grpc.ClientConnInterface = (*Conn)(nil)

// errNotSent: the request was not written, and may be sent again.
var errNotSent = errors.New("rpcwire: request not sent")

// errLegacy: the server answered the Magic with something else.
var errLegacy = errors.New("rpcwire: the server does not speak this protocol")

// Invoke calls a unary method. Call options are not applied.
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if g := c.legacyConn(); g != nil {
		return g.Invoke(ctx, method, args, reply, opts...)
	}
	in, ok := args.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "rpcwire: %T is not a protobuf message", args)
	}
	out, ok := reply.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "rpcwire: %T is not a protobuf message", reply)
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	var timeoutMS uint32
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return status.FromContextError(context.DeadlineExceeded).Err()
		}
		timeoutMS = uint32(min((left+time.Millisecond-1)/time.Millisecond, math.MaxUint32))
	}
	msg, err := proto.Marshal(in)
	if err != nil {
		return status.Errorf(codes.Internal, "rpcwire: marshal the request: %v", err)
	}
	if len(method) == 0 || len(method) > maxMethod {
		return status.Errorf(codes.Internal, "rpcwire: a method name of %d bytes", len(method))
	}
	if len(msg)+len(method)+64 > MaxRequest {
		return status.Errorf(codes.ResourceExhausted, "rpcwire: a request of %d bytes is over the limit of %d", len(msg), MaxRequest)
	}
	for attempt := 0; ; attempt++ {
		cc, reused, err := c.get(ctx)
		if err != nil {
			return err
		}
		st, body, err := cc.call(ctx, timeoutMS, method, msg)
		switch {
		case err == nil:
		case errors.Is(err, errLegacy):
			cc.c.Close()
			g, lerr := c.fallBack()
			if lerr != nil {
				return lerr
			}
			return g.Invoke(ctx, method, args, reply, opts...)
		case errors.Is(err, errNotSent) && reused && attempt <= maxIdle:
			// An idle connection the server closed (skeind restarted,
			// say), and so are the others kept with it. The request
			// never reached the server whole, so it goes again, on a
			// connection dialled now.
			cc.c.Close()
			c.dropIdle()
			continue
		case errors.Is(err, errNotSent):
			cc.c.Close()
			return status.Errorf(codes.Unavailable, "rpcwire: send to skeind at %s: %v", c.socket, err)
		default:
			cc.c.Close()
			return err
		}
		// Decode before the connection goes back: the status and the
		// message are in its buffer.
		if len(st) > 0 {
			var sp spb.Status
			err := proto.Unmarshal(st, &sp)
			c.put(cc)
			if err != nil {
				return status.Errorf(codes.Internal, "rpcwire: malformed status from skeind: %v", err)
			}
			return status.ErrorProto(&sp)
		}
		err = proto.Unmarshal(body, out)
		c.put(cc)
		if err != nil {
			return status.Errorf(codes.Internal, "rpcwire: malformed reply from skeind: %v", err)
		}
		return nil
	}
}

// call sends one request on cc and reads its reply. The status and
// message alias cc's buffer, valid until its next call.
func (cc *clientConn) call(ctx context.Context, timeoutMS uint32, method string, msg []byte) (st, body []byte, err error) {
	// A context that ends mid-call stops the reads and writes; the
	// connection is then closed, which tells skeind to cancel the call.
	stop := context.AfterFunc(ctx, func() { cc.c.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			// The deadline set on the connection makes it unfit for
			// reuse, even when the reply came first.
			cc.broken = true
			if err != nil && !errors.Is(err, errLegacy) {
				err = status.FromContextError(ctx.Err()).Err()
			}
		}
	}()
	b := cc.buf[:0]
	if !cc.greeted {
		b = append(b, Magic...)
	}
	b = appendRequest(b, timeoutMS, method, msg)
	cc.buf = b
	if _, err := cc.c.Write(b); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			return nil, nil, fmt.Errorf("%w: %v", errNotSent, err)
		}
		return nil, nil, status.Errorf(codes.Unavailable, "rpcwire: send to skeind: %v", err)
	}
	if !cc.greeted {
		var m [len(Magic)]byte
		n, err := io.ReadFull(cc.r, m[:])
		if n > 0 && string(m[:n]) != Magic[:n] {
			return nil, nil, errLegacy
		}
		if err != nil {
			return nil, nil, status.Errorf(codes.Unavailable, "rpcwire: skeind closed the connection: %v", err)
		}
		cc.greeted = true
	}
	cc.buf, err = readFrame(cc.r, cc.buf, MaxReply)
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "rpcwire: read skeind's reply: %v", err)
	}
	st, body, err = parseReply(cc.buf)
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "rpcwire: skeind's reply: %v", err)
	}
	return st, body, nil
}

// get returns an idle connection (reused) or a new one.
func (c *Conn) get(ctx context.Context) (_ *clientConn, reused bool, _ error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false, status.Error(codes.Canceled, "rpcwire: the connection is closed")
	}
	now := time.Now()
	for len(c.idle) > 0 {
		cc := c.idle[len(c.idle)-1]
		c.idle = c.idle[:len(c.idle)-1]
		if now.Sub(cc.used) < clientIdle {
			c.mu.Unlock()
			return cc, true, nil
		}
		cc.c.Close()
	}
	c.mu.Unlock()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, status.FromContextError(ctx.Err()).Err()
		}
		return nil, false, status.Errorf(codes.Unavailable, "connect to skeind at %s: %v", c.socket, err)
	}
	return &clientConn{c: nc, r: bufio.NewReader(nc)}, false, nil
}

// dropIdle closes the idle connections.
func (c *Conn) dropIdle() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, cc := range idle {
		cc.c.Close()
	}
}

// put keeps cc for a later call.
func (c *Conn) put(cc *clientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || cc.broken || len(c.idle) >= maxIdle || cap(cc.buf) > 1<<20 {
		cc.c.Close()
		return
	}
	cc.used = time.Now()
	c.idle = append(c.idle, cc)
}

func (c *Conn) legacyConn() *grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.legacy
}

// fallBack switches the Conn to gRPC, for a skeind older than this
// protocol.
func (c *Conn) fallBack() (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.legacy != nil {
		return c.legacy, nil
	}
	if c.closed {
		return nil, status.Error(codes.Canceled, "rpcwire: the connection is closed")
	}
	socket := c.socket
	g, err := grpc.NewClient("passthrough:///skeind",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "connect to skeind at %s: %v", socket, err)
	}
	c.legacy = g
	return g, nil
}

// NewStream is not carried by this protocol, except on a gRPC fallback.
func (c *Conn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if g := c.legacyConn(); g != nil {
		return g.NewStream(ctx, desc, method, opts...)
	}
	return nil, status.Errorf(codes.Unimplemented, "rpcwire: %s is a stream, which this protocol does not carry: use gRPC", method)
}

// Close closes the idle connections and the gRPC fallback's; calls in
// flight on this protocol complete, and their connections are closed
// then.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, cc := range c.idle {
		cc.c.Close()
	}
	c.idle = nil
	if c.legacy != nil {
		return c.legacy.Close()
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/api/rpcwire"
)

// withAdmin connects to skeind, runs call with a context bounded by
// --timeout, and turns a failure into a message for the operator. Each
// skeinctl invocation makes its calls over one connection, closed on return.
func (a *app) withAdmin(ctx context.Context, call func(context.Context, rpc.AdminClient) error) error {
	return a.withConn(ctx, a.timeout, func(ctx context.Context, conn grpc.ClientConnInterface) error {
		return call(ctx, rpc.NewAdminClient(conn))
	})
}

// withConn is withAdmin for any of skeind's services, bounded by timeout.
// The calls go in skeind's framed unary protocol (package rpcwire: no
// HTTP/2 set-up), or over gRPC to a skeind older than it.
func (a *app) withConn(ctx context.Context, timeout time.Duration, call func(context.Context, grpc.ClientConnInterface) error) error {
	conn := rpcwire.Dial(a.socket)
	defer conn.Close()

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := call(ctx, conn); err != nil {
		return a.explain(ctx, timeout, err)
	}
	return nil
}

// explain turns an error from a call into what the operator should read:
// the daemon's own message for errors it returned, and a plain sentence for
// failures to reach it at all.
func (a *app) explain(ctx context.Context, timeout time.Duration, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	// Our own deadline passed: grpc-go usually reports DeadlineExceeded, but
	// the server enforces the same deadline (the grpc-timeout we send) and,
	// when its timer fires first, resets the stream; the call then ends a
	// moment before ours with "stream terminated by RST_STREAM with error
	// code: CANCEL". Either way skeind did not answer in time.
	if deadlinePassed(ctx) {
		switch st.Code() {
		case codes.DeadlineExceeded, codes.Canceled, codes.Internal:
			return fmt.Errorf("skeind at %s did not answer within %s", a.socket, timeout)
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		// gRPC reports a failed dial as Unavailable, but skeind may also
		// answer Unavailable itself (say, while its store opens). A plain
		// dial of the socket tells the two apart.
		if perr := probe(a.socket); perr != nil {
			if errors.Is(perr, fs.ErrPermission) {
				return fmt.Errorf("cannot reach skeind at %s: permission denied (try as root)", a.socket)
			}
			return fmt.Errorf("cannot reach skeind at %s: is it running?", a.socket)
		}
	}
	// A DeadlineExceeded before our own deadline is one the daemon hit
	// internally: its own message says which.
	return errors.New(st.Message())
}

// probe reports whether a UNIX socket accepts connections.
func probe(socket string) error {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// deadlineSlack is how close to its deadline a call may end and still be
// taken as cut off by it (the server's copy of the deadline fires first).
const deadlineSlack = 20 * time.Millisecond

// deadlinePassed reports whether ctx's deadline has passed or is about to.
func deadlinePassed(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < deadlineSlack
}
